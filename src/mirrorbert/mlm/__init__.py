"""MLM pre-training, from scratch or continued, through the one run lifecycle. Modules: `config` (PretrainConfig),
`masking` (BERT's 80/10/10), `models` (the model and tokenizer a run starts from), `method` (packed windows over
the token stream; what the engine runs), `pretrain` (the recipe), `reference` (the quickstart's offline MLM)."""
