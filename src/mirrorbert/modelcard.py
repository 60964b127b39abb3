"""Model card (`README.md`) of every saved model.

The card follows what sentence-transformers writes (YAML front matter, model details, training settings,
evaluation, usage, citation) from the same facts as `mirrorbert.json`, so the two never disagree. The
`--eval-after` scores come in as data (`meta["training"]["eval_after"]`, written by
`mirrorbert.training.eval_after`); the card imports nothing of the evaluation package.
"""

from __future__ import annotations

import json
import re
import logging
from pathlib import Path
from typing import Any

from mirrorbert.scores import format_value

logger = logging.getLogger(__name__)

CARD_FILE = "README.md"
CITATION = """@inproceedings{liu-etal-2021-fast,
    title = "Fast, Effective, and Self-Supervised: Transforming Masked Language Models into Universal Lexical and Sentence Encoders",
    author = "Liu, Fangyu and Vuli{\\'c}, Ivan and Korhonen, Anna and Collier, Nigel",
    booktitle = "Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing",
    month = nov,
    year = "2021",
    address = "Online and Punta Cana, Dominican Republic",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2021.emnlp-main.109",
    doi = "10.18653/v1/2021.emnlp-main.109",
    pages = "1442--1459",
}"""
METHOD_NAMES = {
    "mirror-bert": "Mirror-BERT (self-supervised contrastive tuning with duplicated, masked and dropped-out views)",
    "gr-bert": "GR-BERT (gloss-regularised MLM pre-training)",
    "mlm-pretraining": "masked language model pre-training",
}
# Settings shown in the card, in this order, when the run recorded them.
SETTING_KEYS = (
    "preset", "loss", "temperature", "mask_span", "mask_unit", "mask_min_chars", "dropout", "drophead",
    "controlled_dropout", "pooling",
    "max_length", "batch_size", "lr", "weight_decay", "schedule", "warmup_steps", "max_grad_norm", "epochs",
    "steps", "seed", "precision",
)
# The transformers snippet per pooling: the same vector as mirrorbert and sentence-transformers give.
TRANSFORMERS_POOLING = {
    "cls": "vectors = out.last_hidden_state[:, 0]",
    "mean": ("mask = batch[\"attention_mask\"].unsqueeze(-1).float()\n"
             "vectors = (out.last_hidden_state * mask).sum(1) / mask.sum(1)"),
    "first-last": ("mask = batch[\"attention_mask\"].unsqueeze(-1).float()\n"
                   "tokens = (out.hidden_states[1] + out.hidden_states[-1]) / 2\n"
                   "vectors = (tokens * mask).sum(1) / mask.sum(1)"),
}


# ------------------------------------------------------------------------------------------ the card
def write_model_card(folder: str | Path, meta: dict[str, Any]) -> Path:
    """Write README.md into a model folder from the content of its mirrorbert.json."""
    path = Path(folder) / CARD_FILE
    path.write_text(render_model_card(meta), encoding="utf-8")
    return path


def public_name(value: Any) -> str:
    """What a card may say of a model, file or folder: a hub id as it is; a local path by its last part only.

    A card travels with the model (hub, colleagues); the training machine's absolute paths (home folders,
    cluster mounts) mean nothing there and leak where the model was made.
    """
    text = str(value)
    if text.startswith(("/", "~", "./", "../")) or "\\" in text or Path(text).exists() or text.count("/") > 1:
        return re.split(r"[\\/]", text.rstrip("/\\"))[-1] or text
    return text


def render_model_card(meta: dict[str, Any]) -> str:
    info = meta.get("training") or {}
    config = info.get("config") or {}
    base = public_name(meta.get("base_model") or "unknown")
    pooling = meta.get("pooling", "mean")
    name = public_name(config["output"]) if config.get("output") else "path/to/model"
    method = info.get("method")
    lines = [
        "---",
        f"base_model: {json.dumps(str(base))}",  # key, not output
        "library_name: sentence-transformers",
        "pipeline_tag: sentence-similarity",
        "tags:",
        *[f"- {tag}" for tag in ("sentence-transformers", "feature-extraction", "sentence-similarity", "mirrorbert",
                                 *([method] if method else []))],
        "---",
        "",
        f"# {Path(str(name)).name or name}",
        "",
        (f"An encoder trained from `{base}` with {METHOD_NAMES.get(method, method)} by mirrorbert."
         if method else
         f"An encoder saved by mirrorbert from `{base}` (no training recorded)."),
        "It maps words, phrases and sentences to vectors; compare them with cosine similarity.",
        "",
        "## Model details",
        "",
        f"- base model: `{base}`",
        f"- pooling: `{pooling}`, output dimension {meta.get('dim', '(hidden_size in config.json)')}",
        f"- maximum sequence length: {meta.get('max_length')} tokens",
        "- similarity: cosine",
    ]
    versions = meta.get("versions") or {}
    if versions:
        lines.append("- libraries: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if info:
        lines += ["", "## Training", ""]
        if method:
            lines.append(f"- method: {METHOD_NAMES.get(method, method)}")
        data = info.get("data") or {}
        if data:
            lines.append(f"- training data: {data.get('strings', '?')} strings from `{public_name(data.get('source', '?'))}`"
                         + (f", SHA-256 `{data['sha256']}`" if data.get("sha256") else ""))
        for key, label in (("steps", "optimiser steps"), ("epochs", "epochs done"), ("final_loss", "final loss"),
                           ("wall_time_s", "wall time (s)"), ("device", "device")):
            if info.get(key) is not None:
                lines.append(f"- {label}: {info[key]}")
        settings = [(k, config[k]) for k in SETTING_KEYS if k in config and config[k] is not None]
        if settings:
            lines += ["", "Settings (the resolved configuration; all of it is in `mirrorbert.json`):", "",
                      "| setting | value |", "|---|---|"]
            lines += [f"| {k} | {public_name(v) if isinstance(v, str) else v} |" for k, v in settings]
    lines += _evaluation_section(info.get("eval_after"))
    lines += _usage_section(name, pooling)
    lines += ["", "## Citation", "", "```bibtex", CITATION, "```", ""]
    return "\n".join(lines)


def _evaluation_section(eval_after: dict[str, Any] | None) -> list[str]:
    if not eval_after:
        return []
    lines = ["", "## Evaluation", "",
             f"`--eval-after {','.join(eval_after.get('tasks', []))}` on `{public_name(eval_after.get('data_dir'))}` "
             "(values x100, counts as integers):", ""]
    metrics = eval_after.get("metrics") or {}
    if metrics:
        lines += ["| task | metric | value |", "|---|---|---|"]
        for key, value in metrics.items():
            task, _, metric = key.partition("/")
            lines.append(f"| {task} | {metric} | {format_value(metric.rsplit('/', 1)[-1], value)} |")
    for task, message in (eval_after.get("not_run") or {}).items():
        lines.append(f"- {task}: {' '.join(str(message).split())}")
    return lines


def _usage_section(name: str, pooling: str) -> list[str]:
    pooled = TRANSFORMERS_POOLING.get(pooling, TRANSFORMERS_POOLING["mean"])
    hidden = ", output_hidden_states=True" if pooling == "first-last" else ""
    return [
        "", "## Usage", "", "With sentence-transformers:", "", "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        f"model = SentenceTransformer({str(name)!r})",
        'vectors = model.encode(["a sentence", "another one"])',
        "```", "", "With transformers (the same vectors):", "", "```python",
        "import torch",
        "from transformers import AutoModel, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({str(name)!r})",
        f"model = AutoModel.from_pretrained({str(name)!r}).eval()",
        'batch = tokenizer(["a sentence", "another one"], padding=True, truncation=True, return_tensors="pt")',
        "with torch.no_grad():",
        f"    out = model(**batch{hidden})",
        pooled,
        "```", "", "With mirrorbert:", "", "```python",
        "from mirrorbert import Encoder",
        "",
        f"encoder = Encoder.load({str(name)!r})",
        'vectors = encoder.encode(["a sentence", "another one"])',
        'hits = encoder.search("a query", ["first entry", "second entry"], top_k=1)',
        "```",
    ]
