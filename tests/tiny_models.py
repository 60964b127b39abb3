"""Tiny, locally built MLMs and tokenizers for tests: no network, a few hundred KB each."""

from __future__ import annotations

import json
import string
from pathlib import Path

CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the quick brown fox jumps over the lazy dog",
    "a man is playing a guitar",
    "a woman is slicing an onion",
    "two children are playing football in the garden",
    "the stock market fell sharply today",
    "scientists discovered a new species of frog",
    "heart attack and myocardial infarction",
    "the bank raised interest rates again",
    "she read a book about ancient history",
    "rain is expected tomorrow in the north",
]

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def bert_vocab() -> list[str]:
    words = sorted({w for line in CORPUS for w in line.split()})
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = SPECIALS + chars + ["##" + c for c in string.ascii_lowercase + string.digits] + words
    return list(dict.fromkeys(tokens))  # single-letter words are already characters


def make_tiny_bert(out: Path, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """A BertForMaskedLM with random weights and a WordPiece vocab written here."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(bert_vocab())}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    backend.decoder = decoders.WordPiece()
    tok = BertTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
    )
    tok.model_max_length = 64
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hidden * 2,
        max_position_embeddings=64,
        type_vocab_size=2,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_tiny_roberta(out: Path, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """A RobertaForMaskedLM with a byte-level BPE tokenizer trained here on CORPUS."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS * 4, vocab_size=400, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    )
    from tokenizers import processors

    bpe._tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>"))
    )
    tok = RobertaTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
    )
    tok.model_max_length = 60
    config = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hidden * 2,
        max_position_embeddings=64,
        type_vocab_size=1,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = RobertaForMaskedLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def write_json(path: Path, obj) -> None:
    Path(path).write_text(json.dumps(obj, indent=2), encoding="utf-8")


def _save_tiny(out: Path, model_class, config, tok, seed: int) -> Path:
    import torch

    torch.manual_seed(seed)
    model_class(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _bert_style_tokenizer(out: Path):
    """The WordPiece tokenizer of `make_tiny_bert` (BERT, ELECTRA and DistilBERT share the format)."""
    from transformers import AutoTokenizer

    make_tiny_bert(Path(out) / "_tokenizer_source", hidden=8, layers=1, heads=1)
    return AutoTokenizer.from_pretrained(Path(out) / "_tokenizer_source")


def make_tiny_electra(out: Path, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """An ElectraForMaskedLM (the generator layout) with a separate, smaller embedding size."""
    from transformers import ElectraConfig, ElectraForMaskedLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = _bert_style_tokenizer(out / "src")
    config = ElectraConfig(
        vocab_size=len(tok), embedding_size=hidden // 2, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=hidden * 2, max_position_embeddings=64,
        type_vocab_size=2, pad_token_id=tok.pad_token_id,
    )
    return _save_tiny(out, ElectraForMaskedLM, config, tok, seed)


def make_tiny_distilbert(out: Path, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """A DistilBertForMaskedLM (no token types, its own attention layout)."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM, DistilBertTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    source = _bert_style_tokenizer(out / "src")
    tok = DistilBertTokenizerFast(tokenizer_object=source.backend_tokenizer, unk_token="[UNK]", sep_token="[SEP]",
                                  pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    tok.model_max_length = 64
    config = DistilBertConfig(
        vocab_size=len(tok), dim=hidden, n_layers=layers, n_heads=heads, hidden_dim=hidden * 2,
        max_position_embeddings=64, pad_token_id=tok.pad_token_id,
    )
    return _save_tiny(out, DistilBertForMaskedLM, config, tok, seed)


def make_tiny_xlm_roberta(out: Path, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """An XLMRobertaForMaskedLM: the RoBERTa layout (positions after the padding index), its own type."""
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaForMaskedLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    make_tiny_roberta(out / "src" / "_tokenizer_source", hidden=8, layers=1, heads=1)
    tok = AutoTokenizer.from_pretrained(out / "src" / "_tokenizer_source")
    config = XLMRobertaConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=hidden * 2, max_position_embeddings=64, type_vocab_size=1,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    return _save_tiny(out, XLMRobertaForMaskedLM, config, tok, seed)


# Per-type sizes of a tiny random masked LM (hidden 32, 2 layers) for the architecture matrix; a type not
# listed takes the BERT-style names. Each config keeps the type's own layout (separate embedding sizes for
# ALBERT/ELECTRA/MobileBERT/RemBERT, ModernBERT's alternating global and sliding-window layers, ...).
_BERT_SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                   max_position_embeddings=64)
TINY_SIZES = {
    "distilbert": dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64),
    "xlm": dict(emb_dim=32, n_layers=2, n_heads=2, max_position_embeddings=64),
    "flaubert": dict(emb_dim=32, n_layers=2, n_heads=2, max_position_embeddings=64),
    "funnel": dict(d_model=32, n_head=2, d_head=16, d_inner=64, block_sizes=[1, 1], num_decoder_layers=1,
                   max_position_embeddings=64),
    "albert": dict(_BERT_SIZES, embedding_size=16),
    "electra": dict(_BERT_SIZES, embedding_size=16),
    "mobilebert": dict(_BERT_SIZES, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
                       num_feedforward_networks=1),
    "rembert": dict(_BERT_SIZES, input_embedding_size=16, output_embedding_size=16),
    "modernbert": dict(_BERT_SIZES, global_attn_every_n_layers=2, local_attention=8),
    "nystromformer": dict(_BERT_SIZES, segment_means_seq_len=64, num_landmarks=64),
    "squeezebert": dict(_BERT_SIZES, embedding_size=32),
    "xmod": dict(_BERT_SIZES, languages=["en_XX", "de_DE"], default_language=None),
    "deberta-v2": dict(_BERT_SIZES, relative_attention=True, position_biased_input=False, position_buckets=8,
                       max_relative_positions=16, pos_att_type=["p2c", "c2p"]),
    "deberta": dict(_BERT_SIZES, relative_attention=True, position_biased_input=False,
                    max_relative_positions=16, pos_att_type=["p2c", "c2p"]),
}
# What the architecture matrix covers: every encoder type transformers builds as a masked LM.
MLM_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert", "deberta",
             "deberta-v2", "mpnet", "modernbert", "ernie", "roformer", "convbert", "megatron-bert", "xlm",
             "flaubert", "funnel", "nystromformer", "yoso", "data2vec-text", "xmod", "rembert", "mobilebert",
             "squeezebert")


def make_tiny_mlm(model_type: str, out: Path, seed: int = 0, **overrides) -> Path:
    """A tiny random masked LM of any type transformers builds, with the WordPiece tokenizer of
    `make_tiny_bert` saved as a plain fast tokenizer (every type reads the same ids)."""
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM, PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    source = _bert_style_tokenizer(out / "src")
    tok = PreTrainedTokenizerFast(tokenizer_object=source.backend_tokenizer, unk_token="[UNK]", sep_token="[SEP]",
                                  pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]", bos_token="[CLS]",
                                  eos_token="[SEP]")
    tok.model_max_length = 60
    sizes = dict(TINY_SIZES.get(model_type, _BERT_SIZES), vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    if model_type not in ("xlm", "flaubert"):
        sizes.update(bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    sizes.update(overrides)
    config = AutoConfig.for_model(model_type, **sizes)
    torch.manual_seed(seed)
    AutoModelForMaskedLM.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    import shutil

    shutil.rmtree(out / "src", ignore_errors=True)
    return out
