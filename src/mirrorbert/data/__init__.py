"""Data in: training strings from text, CSV/TSV, JSONL and Hugging Face tables, and the WordNet files GR-BERT reads.

Modules: `readers` (text, CSV/TSV and JSONL as a stream of records with their ids), `strings` (read, clean,
deduplicate, fingerprint training strings), `token_store` (the strings' token ids as flat memory-mapped arrays,
cached by content and tokenizer: open or build), `token_files` (the store's files and reading them),
`token_writing` (the one streaming pass that writes them), `token_checks` (a cached store checked against the data
before use), `hf_datasets` (Parquet, Arrow, saved datasets, `hf:` Hub datasets, a column at a time), `wordnet`
(WordNet's own data files, read without nltk).
"""


def __getattr__(name):
    # `from mirrorbert.data import strings_from_dataset` keeps working without importing every reader up front.
    if name in {"strings_from_dataset", "read_rows", "read_file", "TrainingStrings"}:
        from mirrorbert.data import strings

        return getattr(strings, name)
    raise AttributeError(name)
