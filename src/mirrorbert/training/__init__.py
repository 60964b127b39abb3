"""The one run lifecycle and training engine shared by Mirror-BERT, MLM pre-training and GR-BERT: `run` (guard to
final save; each method supplies a `Recipe`), `engine` (the loop), `plan` (batches and budget), `checkpoints`
(verified folders, rotation, resume rules), `state_format` (training state without pickle), `optim`, `signals`
(interrupts and preemption), `gradcache`, `prefetch` (batches made ahead), `loss_record` (the reported losses).
"""
