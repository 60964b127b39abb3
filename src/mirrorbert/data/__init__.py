"""Data in: training strings from text, CSV/TSV, JSONL and Hugging Face tables, and the WordNet files GR-BERT reads.

Modules: `readers` (text, CSV/TSV and JSONL as a stream of records with their ids), `strings` (read, clean,
deduplicate, fingerprint training strings), `token_cache` (the one token cache: keyed, built atomically,
checked before use) and its two layouts, `token_store` (Mirror-BERT's strings, one row each) and `token_stream`
(the MLM corpus, one token stream per split), `hf_datasets` (Parquet, Arrow, saved datasets, `hf:` Hub
datasets, a column at a time), `wordnet` (WordNet's own data files, read without nltk).
"""
