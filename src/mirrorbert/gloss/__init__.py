"""GR-BERT: gloss-regularised MLM pre-training on WordNet (word, sentence, gloss) triplets, and STS fine-tuning.

Modules: `config` (GlossPretrainConfig), `triplets` (triplets from WordNet's examples), `model` (the context and
gloss encoders, mt and sc architectures, their losses), `method` (what the training engine runs), `parts` (a
checkpoint's encoders), `pretrain` (the recipe: `pretrain()`), `finetune_sts`.
"""
