"""The Mirror-BERT method. Modules: `config` (TrainConfig, presets, config files), `views` (span masking of the
second view), `loss` (InfoNCE, multi-similarity), `step` (one batch; `MirrorMethod`, what the engine runs), `train`
(`train()`: the recipe of the run lifecycle, `--eval-after`), `collapse` (did the embeddings collapse, the fix)."""
