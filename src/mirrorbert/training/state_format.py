"""Training state without pickle: tensors in safetensors, everything else in JSON.

Reading a pickle runs whatever code it names, so a checkpoint's optimiser moments, scheduler, grad-scaler and
RNG state are never one: `save_state` writes two files: `NAME.safetensors` (every
tensor and numpy array) and `NAME.json` (the structure: dicts, lists, tuples, numbers, text, and a reference
`{"__tensor__": key}` where a tensor was). Neither format can carry code. `load_state` rebuilds the exact
object (int dict keys, tuples, non-finite floats and dtypes included), so a resumed run is bit-exact.

`load_legacy_pt` reads a `.pt` written by older mirrorbert with `torch.load(weights_only=True)` and an
allow-list of the numpy types its RNG state holds; a pickle that names anything else is refused in one line
naming the file, never run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import mirrorbert.jsonio as jsonio
from mirrorbert.errors import UserError

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
    import numpy as np
    import torch

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
    from safetensors.torch import save_file

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
    from safetensors.torch import load_file

    from mirrorbert.safeguards.confined import ConfinedFolder

    folder = Path(folder)
    tensor_file, json_file = folder / f"{stem}.safetensors", folder / f"{stem}.json"
    try:
        ck = ConfinedFolder(folder, "checkpoint", "checkpoint")
        data = ck.read_json(json_file.name, limit=JSON_LIMIT)
        real_tensor_file = ck.check_file(tensor_file.name)
    except UserError as exc:  # its line names the file; the option is the caller's
        raise UserError(f"{option}: {str(exc).removeprefix('checkpoint ')}") from None
    try:
        if data.get("format") != FORMAT or "state" not in data:
            raise ValueError("not a mirrorbert training state")
        if data.get("version") != VERSION:
            raise ValueError(f"format version {data.get('version')!r}, this mirrorbert reads {VERSION}")
    except ValueError as exc:
        raise UserError(f"{option}: {json_file} cannot be read ({_first_line(exc)})") from None
    try:
        tensors = load_file(str(real_tensor_file), device="cpu")
    except Exception as exc:  # noqa: BLE001  safetensors raises its own error type for a damaged file
        raise UserError(f"{option}: {tensor_file} cannot be read ({_first_line(exc)})") from None
    try:
        return decode(data["state"], tensors)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise UserError(f"{option}: {json_file} does not match {tensor_file.name} ({_first_line(exc)})") from None


def legacy_safe_globals() -> list[Any]:
    """The numpy types in the RNG state older mirrorbert pickled (`np.random.get_state()`), and nothing else."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_legacy_pt(path: str | os.PathLike, option: str, shown: str | os.PathLike | None = None) -> Any:
    """A `.pt` of older mirrorbert through `torch.load(weights_only=True)`: tensors and plain values only.

    A pickle that would build any other object (the way a crafted file runs code) is refused in one line.
    `path` is the file as checked by the caller's confined reader; `shown` the name the refusal gives it.
    """
    import pickle

    import torch

    read, path = Path(path), Path(shown if shown is not None else path)

    def refused(why: str) -> UserError:
        return UserError(f"{option}: {path} is a pickle that asks for more than tensors and plain values ({why}); "
                         "it is refused, not run (a file from an untrusted source?)")

    with torch.serialization.safe_globals(legacy_safe_globals()):
        try:  # the globals it names, found without unpickling anything
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(read)
        except Exception:  # noqa: BLE001  not torch's zip format: the weights-only load below decides
            unsafe = []
        if unsafe:
            raise refused(f"it names {', '.join(unsafe[:3])}")
        try:
            return torch.load(read, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise refused("torch's weights-only unpickler refused it") from None
        except Exception as exc:  # noqa: BLE001  a truncated or foreign file raises many types
            raise UserError(f"{option}: {path} cannot be read ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
