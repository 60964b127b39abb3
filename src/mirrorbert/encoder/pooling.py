"""The one pooling implementation, used by training, encoding and the saved sentence-transformers files.

- cls: the last layer's first-token vector, taken before any pooler head (the paper's [CLS]).
- mean: attention-masked mean of the last layer.
- first-last: attention-masked mean of the average of the first transformer layer's output
  (hidden_states[1], not the embedding layer) and the last layer's output.
"""

from __future__ import annotations

import torch

from mirrorbert.errors import UserError
from mirrorbert.settings.choices import POOLINGS


def needs_hidden_states(mode: str) -> bool:
    return mode == "first-last"


def masked_mean(tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def _pooled_tokens(outputs, mode: str) -> torch.Tensor:
    """The token vectors `mode` pools: the last layer's, or for first-last the average of the first and last."""
    if mode == "first-last":
        hidden = outputs.hidden_states
        if hidden is None:
            raise ValueError("first-last pooling needs output_hidden_states=True")
        return (hidden[1] + hidden[-1]) / 2
    if mode in ("cls", "mean"):
        return outputs.last_hidden_state
    raise ValueError(f"unknown pooling {mode!r}")


def pool(outputs, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """`outputs` is a HF model output with last_hidden_state (and hidden_states for first-last)."""
    tokens = _pooled_tokens(outputs, mode)
    return tokens[:, 0] if mode == "cls" else masked_mean(tokens, attention_mask)


def pool_views(outputs, view_of_token: torch.Tensor, first_token: torch.Tensor, n_views: int,
               mode: str) -> torch.Tensor:
    """`pool` for packed rows holding several views: `view_of_token` (rows, length) names each token's
    view (-1 for padding), `first_token` (views,) is the flat index of each view's first token."""
    tokens = _pooled_tokens(outputs, mode)
    flat = tokens.reshape(-1, tokens.shape[-1])
    if mode == "cls":
        return flat.index_select(0, first_token)
    owner = view_of_token.reshape(-1)
    real = (owner >= 0).nonzero().squeeze(1)
    owner = owner.index_select(0, real)
    sums = flat.new_zeros((n_views, flat.shape[-1])).index_add_(0, owner, flat.index_select(0, real))
    counts = torch.bincount(owner, minlength=n_views).clamp(min=1).to(sums.dtype)
    return sums / counts.unsqueeze(-1)


def sentence_transformers_modules(mode: str, dim: int, num_layers: int, normalize: bool = False) -> list[dict]:
    """Describe `mode` as stock sentence-transformers modules so SentenceTransformer(path) reproduces it.

    first-last becomes a WeightedLayerPooling over layers 1..L with weights (1, 0, ..., 0, 1), which
    averages exactly the first and last layers, followed by mean pooling. `normalize` (a model loaded with
    a Normalize module, such as all-MiniLM-L6-v2) keeps it last, so the saved folder still gives unit vectors.
    """
    modules = []
    if mode == "first-last":
        weights = [0.0] * num_layers
        weights[0] = weights[-1] = 1.0
        modules.append({
            "type": "sentence_transformers.models.WeightedLayerPooling",
            "folder": "1_WeightedLayerPooling",
            "config": {"word_embedding_dimension": dim, "layer_start": 1, "num_hidden_layers": num_layers},
            "weights": {"layer_weights": torch.tensor(weights)},
        })
    modules.append({
        "type": "sentence_transformers.models.Pooling",
        "folder": f"{len(modules) + 1}_Pooling",
        "config": {
            "word_embedding_dimension": dim,
            "pooling_mode_cls_token": mode == "cls",
            "pooling_mode_mean_tokens": mode in ("mean", "first-last"),
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    })
    if normalize:
        modules.append({"type": "sentence_transformers.models.Normalize", "folder": f"{len(modules) + 1}_Normalize",
                        "config": {}})
    return modules


def pooling_from_sentence_transformers(model) -> tuple[str | None, bool]:
    """Read back (pooling mode, normalize) from a sentence-transformers folder; (None, False) if not one.

    `model` is a checked model folder (`safeguards.model_files.CheckedModel`): modules.json and each module's
    config.json are read as the check parsed them, never opened again."""
    if "modules.json" not in model.json:
        return None, False
    where = model.folder.given / "modules.json"
    mode, normalize, weighted = None, False, False
    for module in model.modules:
        kind = str(module.get("type", ""))
        if not kind.startswith("sentence_transformers."):  # code from elsewhere, that mirrorbert never runs
            raise UserError(f"--model: {where} names a module type from outside sentence-transformers "
                            f"({kind[:120]!r}); mirrorbert reads only sentence-transformers' own modules and "
                            "runs no code from a model folder")
        if kind.endswith("WeightedLayerPooling"):
            weighted = True
        elif kind.endswith("Pooling"):
            cfg_name = f"{module.get('_folder', '.')}/config.json".lstrip("./")
            cfg = model.get(cfg_name, {})
            if not isinstance(cfg, dict):
                raise UserError(f"--model: {model.folder.given / cfg_name} is damaged (expected a JSON object)")
            if cfg.get("pooling_mode_cls_token") or cfg.get("pooling_mode") == "cls":
                mode = "cls"
            elif cfg.get("pooling_mode_mean_tokens") or cfg.get("pooling_mode", "mean") == "mean":
                mode = "first-last" if weighted else "mean"
            else:
                shown = {k: v for k, v in cfg.items() if str(k).startswith("pooling_mode") and v}
                raise UserError(f"--model: {model.folder.given / cfg_name}: pooling mode not supported by "
                                f"mirrorbert ({str(shown)[:160]}); mirrorbert pools by cls, mean or first-last")
        elif kind.endswith("Normalize"):
            normalize = True
    return mode, normalize
