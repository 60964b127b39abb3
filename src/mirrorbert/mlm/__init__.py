"""MLM pre-training: a masked LM trained from scratch or continued on a corpus, through the one training engine.

Modules: `corpus` (the corpus tokenised once into a verified cache), `masking` (BERT's 80/10/10 masking),
`pretrain` (the method: batches and step handed to the engine), `reference` (the quickstart's offline
reference MLM).
"""
