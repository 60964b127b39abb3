"""The one training engine shared by Mirror-BERT, MLM pre-training and GR-BERT: a method supplies batches and a step.

Modules: `engine` (the loop: steps, epochs, progress, checkpoints, resume, preemption, the final save),
`checkpoints` (verified checkpoint folders, rotation, resume rules), `state_format` (training state as
safetensors + JSON, no pickle), `optim` (optimiser, schedule, one update), `signals` (interrupts and
preemption), `gradcache` (cached-gradient steps: big contrastive batches in small memory), `prefetch`
(batches made ahead in a thread), `loss_record` (the reported losses: means over stated windows, carried
through checkpoints), `collapse` (did the embeddings collapse, and why). Device, precision, seeds
and processes are `mirrorbert.runtime`, below.
"""
