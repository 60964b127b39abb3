"""Model card (`README.md`) of every saved model, in sentence-transformers' layout, written from the same facts as
`mirrorbert.json` (the `--eval-after` scores come in as data) and the folder's own `modules.json` and module
configs, read through `ConfinedFolder`; a path recorded in mirrorbert.json is only named, by its last part,
never opened.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.reporting.scores import format_value
from mirrorbert.safeguards.confined import ConfinedFolder

CARD_FILE = "README.md"
PLACEHOLDER_NAME = "path/to/model"
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
GR_BERT_CITATION = """@inproceedings{lin-etal-2022-improving,
    title = "Improving Contextual Representation with Gloss Regularized Pre-training",
    author = "Lin, Yu and An, Zhecheng and Wu, Peihao and Ma, Zejun",
    booktitle = "Findings of the Association for Computational Linguistics: NAACL 2022",
    month = jul,
    year = "2022",
    address = "Seattle, United States",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2022.findings-naacl.68",
    doi = "10.18653/v1/2022.findings-naacl.68",
    pages = "907--920",
    eprint = "2205.06603",
    archivePrefix = "arXiv",
}"""
CITATIONS = {"Mirror-BERT": CITATION, "GR-BERT": GR_BERT_CITATION}
PAPERS = {"Mirror-BERT": "https://aclanthology.org/2021.emnlp-main.109",
          "GR-BERT": "https://arxiv.org/abs/2205.06603"}
METHOD_NAMES = {
    "mirror-bert": "Mirror-BERT (self-supervised contrastive tuning with duplicated, masked and dropped-out views)",
    "gr-bert": "GR-BERT (gloss-regularised MLM pre-training)",
    "mlm-pretraining": "masked language model pre-training",
}
POOLING_NAMES = {
    "cls": "the last layer's first-token ([CLS]) vector",
    "mean": "the attention-masked mean of the last layer's token vectors",
    "first-last": "the attention-masked mean of the average of the first and the last layer's token vectors",
}
# the training record's key listing the settings the card shows, in order (settings.fields.names_with(..., "card"))
CARD_SETTINGS = "card_settings"
VERSION_NAMES = (("python", "Python"), ("mirrorbert", "mirrorbert"), ("sentence_transformers", "Sentence Transformers"),
                 ("transformers", "Transformers"), ("torch", "PyTorch"), ("tokenizers", "Tokenizers"))
TRANSFORMERS_POOLING = {
    "cls": "vectors = out.last_hidden_state[:, 0]",
    "mean": ("mask = batch[\"attention_mask\"].unsqueeze(-1).float()\n"
             "vectors = (out.last_hidden_state * mask).sum(1) / mask.sum(1)"),
    "first-last": ("mask = batch[\"attention_mask\"].unsqueeze(-1).float()\n"
                   "tokens = (out.hidden_states[1] + out.hidden_states[-1]) / 2\n"
                   "vectors = (tokens * mask).sum(1) / mask.sum(1)"),
}


def write_model_card(folder: str | Path, meta: dict[str, Any], name: str | None = None) -> Path:
    """Write README.md into a model folder from the content of its mirrorbert.json (and its module files)."""
    path = Path(folder) / CARD_FILE
    path.write_text(render_model_card(meta, folder=folder, name=name), encoding="utf-8")
    return path


def public_name(value: Any) -> str:
    """What a card may say of a model, file or folder: a hub id as it is; a local path by its last part only."""
    text = str(value)
    if text.startswith(("/", "~", "./", "../")) or "\\" in text or _exists(text) or text.count("/") > 1:
        return re.split(r"[\\/]", text.rstrip("/\\"))[-1] or text
    return text


def _exists(text: str) -> bool:
    """Whether a name recorded in mirrorbert.json is a local path here (a name too long for the filesystem,
    or holding a NUL, is none)."""
    try:
        return Path(text).exists()
    except (OSError, ValueError):
        return False


def render_model_card(meta: dict[str, Any], folder: str | Path | ConfinedFolder | None = None,
                      name: str | None = None, hub: bool = False) -> str:
    """The card's text. `folder`: the saved model folder (its module files give the architecture and the
    sentence-transformers version); `name`: what the usage snippets load (a hub repo id when pushing;
    default: the training output's folder name); `hub`: the card goes to the Hub, whose metadata check
    refuses a `base_model` that is no Hub model, so a local base model is named in the text only."""
    info = meta.get("training") or {}
    config = info.get("config") or {}
    raw_base = meta.get("base_model") or "unknown"
    base = public_name(raw_base)
    pooling = meta.get("pooling", "mean")
    placeholder = name is None and not config.get("output")
    if name is None:
        name = public_name(config["output"]) if config.get("output") else PLACEHOLDER_NAME
    method = info.get("method")
    dim = meta.get("dim", "(hidden_size in config.json)")
    model = model_folder(folder) if folder is not None else None
    data = info.get("data") or {}
    language = config.get("lang") if config.get("words_top") and isinstance(config.get("lang"), str) else None
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "mirrorbert",
            *([method] if method else []),
            *([f"dataset_size:{data['strings']}"] if isinstance(data.get("strings"), int) else [])]
    lines = [
        "---",
        *([f"base_model: {jsonio.dumps(str(base))}"]
          if not hub or (meta.get("base_model") and _is_hub_id(raw_base, base)) else []),
        *(["language:", f"- {jsonio.dumps(language)}"] if language else []),
        "library_name: sentence-transformers",
        "pipeline_tag: sentence-similarity",
        "tags:",
        *[f"- {tag}" for tag in tags],
        "---",
        "",
        f"# {_title(name, base, placeholder)}",
        "",
        _summary(raw_base, base, method, dim),
        "",
        "## Model Details",
        "",
        "### Model Description",
        "",
        "- **Model Type:** Sentence Transformer",
        f"- **Base model:** {_base_link(raw_base, base)}",
        f"- **Maximum Sequence Length:** {meta.get('max_length')} tokens",
        f"- **Output Dimensionality:** {dim} dimensions",
        "- **Similarity Function:** Cosine Similarity",
        f"- **Pooling:** `{pooling}`, {POOLING_NAMES.get(pooling, pooling)}",
        f"- **Training Method:** {METHOD_NAMES.get(method, method) if method else 'none (no training recorded)'}",
        *([f"- **Language:** {language}"] if language else []),
        "",
        "### Model Sources",
        "",
        "- **Papers:** " + ", ".join(f"[{paper}]({url})" for paper, url in PAPERS.items()),
        "- **Documentation:** [Sentence Transformers Documentation](https://sbert.net)",
    ]
    architecture = model_architecture(model) if model is not None else None
    if architecture:
        lines += ["", "### Full Model Architecture", "", "```", architecture, "```"]
    lines += _usage_section(name, pooling, dim)
    lines += _evaluation_section(info.get("eval_after"))
    if info:
        lines += _training_section(info, config, data, method)
    lines += _versions_section(meta.get("versions") or {}, model)
    lines += ["", "## Citation", "", "### BibTeX"]
    for paper, citation in CITATIONS.items():
        lines += ["", f"#### {paper}", "", "```bibtex", citation, "```"]
    lines.append("")
    # a name that is not UTF-8 (held with surrogates) shows its odd bytes escaped; mirrorbert.json keeps it exactly
    return "\n".join(lines).encode("utf-8", "backslashreplace").decode("utf-8")


def _title(name: str, base: str, placeholder: bool) -> str:
    """The card's heading: the model's (repo's or folder's) name; sentence-transformers' wording without one."""
    if placeholder:
        return f"SentenceTransformer based on {base}"
    return str(name).rstrip("/").rsplit("/", 1)[-1] or str(name)


HUB_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)?")


def _is_hub_id(raw: Any, shown: str) -> bool:
    """A base model named by hub id (linked in the card); a local folder is named, not linked."""
    return str(raw) == shown and bool(HUB_ID.fullmatch(shown)) and not _exists(shown)


def _base_link(raw: Any, base: str, local: str = " (a local model)") -> str:
    return f"[{base}](https://huggingface.co/{base})" if _is_hub_id(raw, base) else f"`{base}`{local}"


def _summary(raw: Any, base: str, method: str | None, dim: Any) -> str:
    source = _base_link(raw, base, local="")
    how = (f"finetuned from {source} with {METHOD_NAMES.get(method, method)} by mirrorbert" if method else
           f"saved by mirrorbert from {source} (no training recorded)")
    return (f"This is a [sentence-transformers](https://www.SBERT.net) model {how}. It maps words, phrases and "
            f"sentences to a {dim}-dimensional dense vector space; compare them with cosine similarity.")


def model_folder(folder: str | Path | ConfinedFolder) -> ConfinedFolder:
    """The card's reader of a model folder: every file it shows comes from inside the folder."""
    return folder if isinstance(folder, ConfinedFolder) else ConfinedFolder(folder, "--model", kind="model folder")


def model_architecture(folder: str | Path | ConfinedFolder) -> str | None:
    """The model as sentence-transformers prints it (`SentenceTransformer(\n  (0): Transformer({...})...`), read
    from `modules.json` and the module configs; None if the folder has none. A module folder that leads out of the
    folder, or a file that is not a regular JSON file inside it, is refused (`UserError`)."""
    model = model_folder(folder)
    if not model.exists("modules.json"):
        return None
    modules = model.read_json("modules.json", None)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        return None
    lines = ["SentenceTransformer("]
    for position, module in enumerate(modules):
        lines.append(f"  ({module.get('idx', position)}): {_module_line(model, module)}")
    lines.append(")")
    return "\n".join(lines)


def _module_line(model: ConfinedFolder, module: dict[str, Any]) -> str:
    kind = str(module.get("type", "")).rsplit(".", 1)[-1] or "Module"
    path = module.get("path") or ""
    where = model.subfolder(str(path), named_in="modules.json") if path else model
    if kind == "Transformer":
        settings = _optional_json(model, "sentence_bert_config.json")
        hf = _optional_json(where, "config.json")
        architectures = hf.get("architectures")
        shown = {"max_seq_length": settings.get("max_seq_length"),
                 "do_lower_case": settings.get("do_lower_case", False),
                 "architecture": architectures[0] if isinstance(architectures, list) and architectures
                 else hf.get("model_type", "unknown")}
        return f"Transformer({shown!r})"
    if kind == "Normalize":
        return "Normalize()"
    return f"{kind}({_optional_json(where, 'config.json')!r})"


def _optional_json(model: ConfinedFolder, name: str) -> dict[str, Any]:
    if not model.exists(name):
        return {}
    value = model.read_json(name, None)
    return value if isinstance(value, dict) else {}


def _evaluation_section(eval_after: dict[str, Any] | None) -> list[str]:
    if not eval_after:
        return []
    lines = ["", "## Evaluation", "", "### Metrics", "",
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


def _training_section(info: dict[str, Any], config: dict[str, Any], data: dict[str, Any],
                      method: str | None) -> list[str]:
    lines = ["", "## Training Details", ""]
    if data or isinstance(info.get("triplets"), dict):
        lines += ["### Training Dataset", ""]
        if data:
            lines.append(f"- {data.get('strings', '?')} strings from `{public_name(data.get('source', '?'))}`"
                         + (f", SHA-256 `{data['sha256']}`" if data.get("sha256") else ""))
        triplets = info.get("triplets")
        if isinstance(triplets, dict):
            lines += [f"- triplets, {key}: {value}" for key, value in triplets.items()
                      if isinstance(value, (int, float, str)) and not isinstance(value, bool)]
        lines.append("")
    lines += ["### Training Hyperparameters", ""]
    if method:
        lines.append(f"- method: {METHOD_NAMES.get(method, method)}")
    window = info.get("final_loss_window_steps")
    final = f"final loss (mean of the last {window} steps)" if type(window) is int and window > 0 else "final loss"
    for key, label in (("steps", "optimiser steps"), ("epochs", "epochs done"), ("final_loss", final),
                       ("wall_time_s", "wall time (s)"), ("device", "device")):
        if info.get(key) is not None:
            lines.append(f"- {label}: {info[key]}")
    keys = info.get(CARD_SETTINGS)
    keys = [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []
    settings = [(k, config[k]) for k in keys if k in config and config[k] is not None]
    if settings:
        lines += ["", "Settings (the resolved configuration; all of it is in `mirrorbert.json`):", "",
                  "| setting | value |", "|---|---|"]
        lines += [f"| {k} | {public_name(v) if isinstance(v, str) else v} |" for k, v in settings]
    return lines


def _versions_section(versions: dict[str, Any], folder: ConfinedFolder | None) -> list[str]:
    versions = dict(versions)
    if folder is not None and "sentence_transformers" not in versions:
        recorded = _optional_json(folder, "config_sentence_transformers.json").get("__version__") or {}
        if isinstance(recorded, dict) and recorded.get("sentence_transformers") not in (None, "unknown"):
            versions["sentence_transformers"] = recorded["sentence_transformers"]
    if not versions:
        return []
    known = dict(VERSION_NAMES)
    lines = ["", "## Framework Versions", ""]
    lines += [f"- {known[key]}: {versions[key]}" for key, _ in VERSION_NAMES if key in versions]
    lines += [f"- {key}: {value}" for key, value in versions.items() if key not in known]
    return lines


def _usage_section(name: str, pooling: str, dim: Any) -> list[str]:
    pooled = TRANSFORMERS_POOLING.get(pooling, TRANSFORMERS_POOLING["mean"])
    hidden = ", output_hidden_states=True" if pooling == "first-last" else ""
    return [
        "", "## Usage", "", "### Direct Usage (Sentence Transformers)", "",
        "First install the Sentence Transformers library:", "", "```bash", "pip install -U sentence-transformers",
        "```", "", "Then you can load this model and run inference.", "", "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        f"model = SentenceTransformer({str(name)!r})",
        'sentences = ["a cat sat on the mat", "heart attack", "the bank raised rates"]',
        "embeddings = model.encode(sentences)",
        "print(embeddings.shape)",
        f"# [3, {dim}]",
        "similarities = model.similarity(embeddings, embeddings)  # cosine",
        "print(similarities.shape)",
        "# [3, 3]",
        "```", "", "### Direct Usage (Transformers)", "",
        f"The same vectors without sentence-transformers (pooling `{pooling}`: {POOLING_NAMES.get(pooling, pooling)}):",
        "", "```python",
        "import torch",
        "from transformers import AutoModel, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({str(name)!r})",
        f"model = AutoModel.from_pretrained({str(name)!r}).eval()",
        'batch = tokenizer(["a sentence", "another one"], padding=True, truncation=True, return_tensors="pt")',
        "with torch.no_grad():",
        f"    out = model(**batch{hidden})",
        pooled,
        "```", "", "### Direct Usage (mirrorbert)", "", "```python",
        "from mirrorbert import Encoder",
        "from mirrorbert.search import search",
        "",
        f"encoder = Encoder.load({str(name)!r})",
        'vectors = encoder.encode(["a sentence", "another one"])',
        'hits = search(encoder, "a query", ["first entry", "second entry"], top_k=1)',
        "```",
    ]
