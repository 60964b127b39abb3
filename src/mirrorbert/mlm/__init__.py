"""MLM pre-training: a masked LM trained from scratch or continued on a corpus, through the one run lifecycle.

Modules: `config` (PretrainConfig), `masking` (BERT's 80/10/10 masking), `models` (the model and tokenizer a run
starts from), `method` (packed windows over the corpus `data.token_stream` tokenises once into the token cache;
batches, step and evaluation handed to the engine), `pretrain` (the recipe: `pretrain()`), `reference` (the
quickstart's offline reference MLM).
"""
