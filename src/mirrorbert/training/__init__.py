"""The one training engine shared by Mirror-BERT, MLM pre-training and GR-BERT.

Modules: `engine` (the loop: steps, epochs, progress, checkpoints, resume, preemption, the final save),
`device` (device and precision), `randomness` (seeds and RNG state), `checkpoints` (verified checkpoint
folders), `optim` (optimiser, schedule, one update), `signals` (interrupts and preemption), `metrics`
(TensorBoard scalars, library versions), `eval_after` (`--eval-after`). Nothing is imported here, so a
low-level module may use `mirrorbert.training.device` without pulling in the engine.
"""
