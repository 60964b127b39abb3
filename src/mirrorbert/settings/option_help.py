"""The wording of every option that several commands or configs share, written once.

A config field names one with `option(..., shared="lr")` (settings/fields.py) and a command's shared option
(cli/options.py) reads the same entry, so `--lr` says "AdamW learning rate" wherever it appears. `unset` is
what a None default means in --help ("(default: $MIRRORBERT_DATA)"). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wording:
    help: str
    unset: str | None = None


SHARED: dict[str, Wording] = {
    # model and output
    "model": Wording("model folder or Hugging Face hub id"),
    "output": Wording("where to write"),
    "overwrite": Wording("replace an existing --output (a folder only if mirrorbert wrote it)"),
    "architecture": Wording("model architecture: bert-tiny (L2/H128) | bert-mini (L4/H256) | bert-small (L4/H512) | "
                            "bert-medium (L8/H512), or a config JSON file"),
    "trust_remote_code": Wording("run Python code shipped with the model (an auto_map in its config.json or "
                                 "tokenizer_config.json); only for a model whose author you trust. Without it such "
                                 "a model is refused; nothing is ever asked on standard input"),
    # input
    "data_dir": Wording("the data directory", unset="$MIRRORBERT_DATA"),
    "corpus": Wording("the corpus"),
    "column": Wording("column holding the text in a CSV/TSV/Parquet/Arrow file or saved dataset"),
    "field": Wording("field holding the text in a JSONL file"),
    "skip_bad_lines": Wording("skip lines that are not UTF-8 instead of stopping"),
    "limit": Wording("use only N inputs"),
    # encoding
    "pooling": Wording("cls | mean | first-last", unset="the model's saved pooling"),
    "max_length": Wording("truncate inputs to N tokens", unset="the model's"),
    "batch_size": Wording("batch size"),
    "eval_batch_size": Wording("batch size of the evaluations"),
    "packing": Wording("auto | on | grouped | off: how a batch avoids padding. on: several strings per row with "
                       "block-diagonal attention (14 encoder types: docs/guide/architectures.md); grouped: strings sorted "
                       "by length and run in small padded groups (any model, least memory); off: padded to the "
                       "batch's longest. Default auto: packed rows where the model supports them and they cost fewer "
                       "FLOPs than padding (random training batches; encode's length-sorted batches stay padded), "
                       "length groups for models that cannot be packed"),
    "quantize": Wording("float32 (exact vectors) or a quantisation"),
    "nprobe": Wording("ivf: lists scanned per query; more finds more true neighbours, more slowly",
                      unset="index: 4 x the square root of nlist; search: the index's own"),
    # optimisation
    "lr": Wording("AdamW learning rate"),
    "weight_decay": Wording("AdamW weight decay"),
    "warmup": Wording("warmup fraction of all steps"),
    "warmup_steps": Wording("linear warmup steps"),
    "max_grad_norm": Wording("clip gradients to this norm", unset="off"),
    "epochs": Wording("passes over the training data"),
    "steps": Wording("stop after N optimiser steps (overrides --epochs)"),
    "seeds": Wording("comma-separated training seeds; several give mean ± std"),
    # hardware
    "device": Wording("auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:1 | mps"),
    "precision": Wording("fp32 | bf16 | fp16 (GPU only) | auto (bf16 where native, i.e. Ampere+ GPUs and CPUs with "
                         "AVX512-BF16/AMX; fp16 on older GPUs; else fp32)"),
    "threads": Wording("CPU threads for torch", unset="torch's choice, usually all cores"),
    # bookkeeping
    "no_progress": Wording("no progress: neither the bar on a terminal nor the line every 30 s "
                           "(MIRRORBERT_PROGRESS_INTERVAL) in a log"),
}


def wording(name: str) -> Wording:
    return SHARED[name]


__all__ = ["SHARED", "Wording", "wording"]
