"""The one run lifecycle and training engine shared by Mirror-BERT, MLM pre-training and GR-BERT.

Modules: `run` (a run from guard to final save; each method supplies a `Recipe`), `engine` (the loop: steps,
progress, checkpoints, resume position, preemption, the final save), `plan` (how examples are cut into
batches, and the budget), `checkpoints` (verified checkpoint folders, rotation, resume rules), `state_format`
(training state as safetensors + JSON, no pickle), `optim` (optimiser, schedule, one update), `signals`
(interrupts and preemption), `gradcache` (cached-gradient steps: big contrastive batches in small memory),
`prefetch` (batches made ahead in a thread), `loss_record` (the reported losses: means over stated windows,
carried through checkpoints). Device, precision, seeds and processes are `mirrorbert.runtime`, below.
"""
