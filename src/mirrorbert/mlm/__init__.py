"""MLM pre-training: a masked LM trained from scratch or continued on a corpus, through the one run lifecycle.

Modules: `config` (PretrainConfig), `corpus` (the corpus tokenised once into a cache), `corpus_lines` (the
corpus read line by line, split into training and held-out documents), `corpus_checks` (a cache checked against
the corpus before use), `tokenized` (the cache's layout, streams and packed sequences), `masking`
(BERT's 80/10/10 masking), `models` (the model and tokenizer a run starts from), `method` (batches, step and
evaluation handed to the engine), `pretrain` (the recipe: `pretrain()`), `reference` (the quickstart's
offline reference MLM).
"""
