"""The Mirror-BERT method: its config and the paper's presets, the two views, the losses, the step and `train()`.

Modules: `config` (TrainConfig, presets, config files), `views` (tokenisation and span masking of the second
view), `loss` (InfoNCE, multi-similarity), `step` (one batch: both views embedded with dropout on, the loss,
one update; `MirrorMethod` is what the engine runs), `train` (`train()`: the recipe of the run lifecycle:
strings, model, resume checks, `--eval-after`, save), `collapse` (did the embeddings collapse, and the likely
fix). It runs through `mirrorbert.training` and the encoder below it.
"""
