"""Training state without pickle (which runs whatever code it names): `save_state` writes `NAME.safetensors`
(every tensor and numpy array) and `NAME.json` (the structure, with `{"__tensor__": key}` where a tensor was);
`load_state` rebuilds the exact object (int keys, tuples, non-finite floats, dtypes), so a resume is bit-exact.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError, first_line
from mirrorbert.safeguards.confined import ConfinedFolder

FORMAT = "mirrorbert-training-state"
VERSION = 1
JSON_LIMIT = 64 << 20  # the state's structure (the tensors are in the .safetensors file)
# Markers of the JSON encoding; a plain dict whose keys collide with them is written as pairs.
_TENSOR, _NDARRAY, _TUPLE, _PAIRS, _FLOAT = "__tensor__", "__ndarray__", "__tuple__", "__pairs__", "__float__"
_MARKERS = {_TENSOR, _NDARRAY, _TUPLE, _PAIRS, _FLOAT}
# Unsigned numpy arrays are stored as the signed type of the same width (read back as a view, bit for bit).
_UNSIGNED_VIEWS = {"<u2": "<i2", "<u4": "<i4", "<u8": "<i8"}


def encode(obj: Any, tensors: dict[str, Any], path: str = "s") -> Any:
    """`obj` as JSON-ready values; every tensor (and numpy array) moves into `tensors` under a path-like key."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {_FLOAT: repr(obj)}
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj
        return {_TENSOR: path}
    if isinstance(obj, np.ndarray):
        array = np.ascontiguousarray(obj)
        if array.dtype.str in _UNSIGNED_VIEWS:  # e.g. numpy's RNG key; older safetensors has no uint32
            tensors[path] = torch.from_numpy(array.view(_UNSIGNED_VIEWS[array.dtype.str]))
            return {_NDARRAY: [path, array.dtype.str]}
        tensors[path] = torch.from_numpy(array)
        return {_NDARRAY: path}
    if isinstance(obj, np.generic):  # a numpy scalar: its Python value
        return encode(obj.item(), tensors, path)
    if isinstance(obj, tuple):
        return {_TUPLE: [encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (_MARKERS & set(obj)):
            return {k: encode(v, tensors, f"{path}/{k}") for k, v in obj.items()}
        # int keys (an optimiser's parameter ids) and anything else JSON objects cannot key by
        return {_PAIRS: [[encode(k, tensors, f"{path}/k{i}"), encode(v, tensors, f"{path}/{i}")]
                         for i, (k, v) in enumerate(obj.items())]}
    raise TypeError(f"training state holds a {type(obj).__name__} at {path}; only tensors, numbers, text, "
                    "lists, tuples and dicts can be saved")


def decode(obj: Any, tensors: dict[str, Any]) -> Any:
    """The inverse of `encode`."""
    if isinstance(obj, list):
        return [decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (key, value), = obj.items()
        if key == _TENSOR:
            return tensors[value]
        if key == _NDARRAY:
            if isinstance(value, list):  # [path, dtype]: stored as the signed type of the same width
                path, dtype = value
                if dtype not in _UNSIGNED_VIEWS:
                    raise ValueError(f"array type {dtype!r} is not one training state holds")
                return tensors[path].numpy().view(dtype)
            return tensors[value].numpy()
        if key == _TUPLE:
            return tuple(decode(v, tensors) for v in value)
        if key == _PAIRS:
            return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in value}
        if key == _FLOAT:
            return float(value)
    return {k: decode(v, tensors) for k, v in obj.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def save_state(folder: str | os.PathLike, stem: str, state: Any) -> tuple[Path, Path]:
    """Write `folder/stem.safetensors` and `folder/stem.json`; returns both paths."""
    folder = Path(folder)
    tensors: dict[str, Any] = {}
    structure = encode(state, tensors)
    seen: set[tuple[int, int]] = set()
    flat = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if tensor.numel() else None
        if where is not None and where in seen:  # safetensors refuses tensors that share memory
            tensor = tensor.clone()
        elif where is not None:
            seen.add(where)
        flat[key] = tensor
    tensor_file, json_file = folder / f"{stem}.safetensors", folder / f"{stem}.json"
    save_file(flat, str(tensor_file), metadata={"format": FORMAT})
    json_file.write_text(jsonio.dumps({"format": FORMAT, "version": VERSION, "state": structure},
                                     ensure_ascii=True, separators=(",", ":")) + "\n", encoding="utf-8")
    return tensor_file, json_file


def load_state(folder: str | os.PathLike, stem: str, option: str) -> Any:
    """What `save_state` wrote, or one UserError naming the damaged file. Both files are read only inside
    `folder` (`safeguards.confined`: no link out, no FIFO or device, the JSON bounded in size and depth)."""
    folder = Path(folder)
    tensor_file, json_file = folder / f"{stem}.safetensors", folder / f"{stem}.json"
    try:
        ck = ConfinedFolder(folder, "checkpoint", "checkpoint")
        data = ck.read_json(json_file.name, limit=JSON_LIMIT)
        with ck.library_path(tensor_file.name) as checked:
            try:
                tensors = load_file(str(checked), device="cpu")
            except Exception as exc:  # noqa: BLE001  safetensors raises its own error type for a damaged file
                raise UserError(f"checkpoint {tensor_file} cannot be read ({first_line(exc)})") from None
    except UserError as exc:  # its line names the file; the option is the caller's
        raise UserError(f"{option}: {str(exc).removeprefix('checkpoint ')}") from None
    if data.get("format") != FORMAT or "state" not in data:
        raise UserError(f"{option}: {json_file} cannot be read (not a mirrorbert training state)")
    if data.get("version") != VERSION:
        raise UserError(f"{option}: {json_file} cannot be read (format version {data.get('version')!r}, this "
                        f"mirrorbert reads {VERSION})")
    try:
        return decode(data["state"], tensors)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise UserError(f"{option}: {json_file} does not match {tensor_file.name} ({first_line(exc)})") from None
