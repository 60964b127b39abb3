"""GR-BERT: gloss-regularised MLM pre-training on (word, sentence, gloss) triplets, and STS fine-tuning. Modules:
`config`, `triplets`, `model` (the context and gloss encoders, mt and sc, their losses), `method` (what the engine
runs), `parts` (a checkpoint's encoders), `pretrain` (the recipe), `finetune_sts`."""
