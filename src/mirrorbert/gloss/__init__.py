"""GR-BERT: gloss-regularised MLM pre-training on WordNet (word, sentence, gloss) triplets, and STS fine-tuning.

Modules: `triplets` (triplets from WordNet's examples), `model` (the context and gloss encoders, mt and sc
architectures), `losses`, `pretrain` (the method handed to the training engine), `finetune_sts`.
"""
