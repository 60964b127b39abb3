"""The wording and checks (facts a field may override) of every option several commands share, written once:
`option(..., shared="lr")`. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mirrorbert.settings.choices import PACKING_MODES, POOLINGS, PRECISIONS

COUNT = "[1, inf)"  # a whole number of something, at least one
# Seeds every generator accepts (numpy's legacy seed, torch.manual_seed, random): a bigger one overflows in torch.
SEEDS = f"[0, {2**32 - 1}]"
# The --max-length note of the commands that run a masked LM over sentences (gloss-pretrain, lexsub, finetune-sts).
MODEL_POSITIONS = "at most the model's positions"


@dataclass(frozen=True)
class Wording:
    help: str
    unset: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


def _w(help: str, unset: str | None = None, **facts: Any) -> Wording:
    return Wording(help, unset, facts)


SHARED: dict[str, Wording] = {
    # model and output
    "model": _w("model folder or Hugging Face hub id"),
    "output": _w("where to write"),
    "overwrite": _w("replace an existing --output (a folder only if mirrorbert wrote it)"),
    "architecture": _w("model architecture: bert-tiny (L2/H128) | bert-mini (L4/H256) | bert-small (L4/H512) | "
                       "bert-medium (L8/H512), or a config JSON file"),
    "trust_remote_code": _w("run Python code shipped with the model (an auto_map in its config.json or "
                            "tokenizer_config.json); only for a model whose author you trust. Without it such "
                            "a model is refused; nothing is ever asked on standard input"),
    # input
    "data_dir": _w("the data directory", unset="$MIRRORBERT_DATA"),
    "corpus": _w("the corpus"),
    "column": _w("column holding the text in a CSV/TSV/Parquet/Arrow file or saved dataset"),
    "field": _w("field holding the text in a JSONL file"),
    "no_header": _w("the CSV/TSV file has no header row: every line is data, and --column gives the column by "
                    "number (1: the first)"),
    "skip_bad_lines": _w("skip lines that are not UTF-8 instead of stopping"),
    "limit": _w("use only N inputs", range=COUNT),
    # encoding
    "pooling": _w("cls | mean | first-last", unset="the model's saved pooling", choices=POOLINGS),
    "max_length": _w("truncate inputs to N tokens", unset="the model's", range=COUNT),
    "batch_size": _w("batch size", range=COUNT),
    "eval_batch_size": _w("batch size of the evaluations", range=COUNT),
    "packing": _w("auto | on | grouped | off: how a batch avoids padding. on: several strings per row with "
                  "block-diagonal attention (14 encoder types: docs/guide/architectures.md); grouped: strings sorted "
                  "by length and run in small padded groups (any model, least memory); off: padded to the "
                  "batch's longest. Default auto: packed rows where the model supports them and they cost fewer "
                  "FLOPs than padding (random training batches; encode's length-sorted batches stay padded), "
                  "length groups for models that cannot be packed", choices=PACKING_MODES),
    "quantize": _w("float32 (exact vectors) or a quantisation"),
    "nprobe": _w("ivf: lists scanned per query; more finds more true neighbours, more slowly",
                 unset="index: 4 x the square root of nlist; search: the index's own", range=COUNT),
    # optimisation
    "lr": _w("AdamW learning rate", range="(0, 1]"),
    "weight_decay": _w("AdamW weight decay", range="[0, inf)"),
    "warmup": _w("warmup fraction of all steps", range="[0, 1)"),
    "warmup_steps": _w("linear warmup steps", range="[0, inf)"),
    "max_grad_norm": _w("clip gradients to this norm", unset="off", range="(0, inf)"),
    "epochs": _w("passes over the training data", range=COUNT),
    "steps": _w("stop after N optimiser steps (overrides --epochs)", range=COUNT),
    "seed": _w("random seed", range=SEEDS),
    "seeds": _w("comma-separated training seeds; several give mean ± std", range=SEEDS),
    # hardware
    "device": _w("auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:1 | mps"),
    "precision": _w("fp32 | bf16 | fp16 (loss-scaled; on a CPU through torch's CPU autocast) | auto (bf16 where "
                    "native, i.e. Ampere+ GPUs and CPUs with AVX512-BF16/AMX; fp16 on older GPUs; else fp32)",
                    choices=PRECISIONS),
    "threads": _w("CPU threads for torch", unset="torch's choice, usually all cores", range=COUNT),
    # bookkeeping
    "no_progress": _w("no progress: neither the bar on a terminal nor the line every 30 s "
                      "(MIRRORBERT_PROGRESS_INTERVAL) in a log"),
}


__all__ = ["SHARED", "Wording"]
