"""The one place mirrorbert loads a config, tokenizer or model from a name or folder: no code from files.

A model folder (or hub repository) can ask transformers to import Python files it ships: `auto_map` in its
`config.json` or `tokenizer_config.json` names classes in the folder's own `.py` files. transformers runs them
when `trust_remote_code=True` and, when the argument is left out, *asks on standard input*, so `yes | mirrorbert
...` would run a stranger's code. Every load here:

* passes `trust_remote_code` explicitly (False unless the user gave `--trust-remote-code` on the command line or
  `trust_remote_code=True` in Python), so transformers never prompts;
* refuses, before anything is loaded, a local folder whose `config.json` or `tokenizer_config.json` has an
  `auto_map`, in one line naming the file and the option that would allow it; a hub config that carries one
  is refused the same way once read (its JSON only: no code runs to read it);
* reads weights without running code: `model.safetensors` cannot carry any, and a pickle-only
  `pytorch_model.bin` is first scanned for the globals it names without unpickling it
  (`check_pickle_weights`: one naming anything but tensors and plain containers is refused in one line), then
  loaded with `weights_only=True` (torch's restricted unpickler, a second line of defence that `pickle_refusal`
  words as one line). A clean `.bin` still loads.

`tests/safeguards/test_remote_code.py` checks that no other module of mirrorbert calls `from_pretrained`, `from_config`
or `torch.load`, so this stays the one place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mirrorbert.compat import from_pretrained_takes_weights_only
from mirrorbert.errors import UserError
from mirrorbert.safeguards.model_folder import TRUST_OPTION, summary as _summary


def check_trust_flag(value: Any, option: str = "trust_remote_code") -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{option}: must be true or false, not {value!r}")
    return value


def _refusal(name: str, option: str, reason: str) -> UserError:
    return UserError(f"{option} {name}: {reason}; pass {TRUST_OPTION} if you trust its author")


def check_remote_code(name: str | os.PathLike, trust_remote_code: bool = False, option: str = "--model") -> None:
    """Check a local folder before any library reads it (`model_folder.vet_model_folder`: every file a loader
    opens is a regular file inside it, bounded, parseable), and refuse one that asks to run its own code
    (an auto_map, a module type outside sentence-transformers), unless the user said they trust it."""
    from mirrorbert.safeguards.model_folder import vet_if_local

    check_trust_flag(trust_remote_code)
    vet_if_local(name, option, trust_remote_code)


def _remote_code_error(exc: BaseException, name: str, option: str) -> UserError | None:
    """transformers' own refusal (explicit trust_remote_code=False on a model that needs its code) as one line."""
    if isinstance(exc, ValueError) and "trust_remote_code" in str(exc):
        return _refusal(name, option, "it needs to run code shipped with the model (custom classes)")
    return None


def pickle_refusal(exc: BaseException, name: str, option: str = "--model") -> UserError | None:
    """torch's weights-only unpickler refusing a pickle (pytorch_model.bin asking for more than tensors) as one
    line; None for any other error."""
    import pickle

    seen = exc  # transformers 4.x wraps the unpickler's error in an OSError (raise ... from)
    while seen is not None and not isinstance(seen, pickle.UnpicklingError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    folder = Path(name)
    files = sorted(p.name for p in folder.glob("*.bin")) if folder.is_dir() else []
    which = f"{folder / files[0]}" if len(files) == 1 else (f"its {', '.join(files)}" if files else "its weights")
    return UserError(f"{option} {name}: {which} is a pickle that asks for more than tensors (it could run code); "
                     "refused, not loaded (ask for model.safetensors)")


def loader_refusal(exc: BaseException, name: str, option: str = "--model") -> UserError | None:
    """A loader's refusal to run code (a pickle asking for globals, a model needing its own classes) as one line;
    None for any other error."""
    return pickle_refusal(exc, name, option) or _remote_code_error(exc, name, option)


def check_pickle_weights(name: str | os.PathLike, option: str = "--model") -> None:
    """Pickle weights a loader would read (`pytorch_model*.bin` in a folder without safetensors), scanned for the
    globals they name without unpickling anything (`torch.serialization.get_unsafe_globals_in_checkpoint`):
    one that names more than tensors and plain containers is refused in one line, before any work."""
    folder = Path(name)
    if not folder.is_dir() or any(folder.glob("*.safetensors")):
        return
    from torch.serialization import get_unsafe_globals_in_checkpoint

    for path in sorted(folder.glob("pytorch_model*.bin")):
        try:
            unsafe = get_unsafe_globals_in_checkpoint(path)
        except Exception:  # noqa: BLE001  not torch's zip format: the weights-only load refuses or reads it
            continue
        if unsafe:
            raise UserError(f"{option} {name}: {path} is a pickle that names {', '.join(unsafe[:3])} (code that "
                            "loading it would run); refused, not loaded (ask for model.safetensors)")


def _check_loaded_config(config: Any, name: str, trust_remote_code: bool, option: str) -> None:
    """A hub config (no local folder to look into first) that asks for code: the same refusal, once read."""
    auto_map = getattr(config, "auto_map", None)
    if auto_map and not trust_remote_code:
        raise _refusal(name, option, f"its config.json asks to run code shipped with the model "
                                     f"(auto_map: {_summary(auto_map)})")


def load_config(name: str | os.PathLike, *, trust_remote_code: bool = False, option: str = "--model", **kwargs):
    """`AutoConfig.from_pretrained` with the remote-code rule; other errors are the caller's to word."""
    from transformers import AutoConfig

    check_remote_code(name, trust_remote_code, option)
    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, **kwargs)
    except ValueError as exc:
        raise _remote_code_error(exc, str(name), option) or exc
    _check_loaded_config(config, str(name), trust_remote_code, option)
    return config


def config_for_model(model_type: str, **values):
    """`AutoConfig.for_model`: transformers' own classes only (it never imports code from a file)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **values)


def load_tokenizer(name: str | os.PathLike, *, trust_remote_code: bool = False, option: str = "--model", **kwargs):
    """`AutoTokenizer.from_pretrained` with the remote-code rule."""
    from transformers import AutoTokenizer

    check_remote_code(name, trust_remote_code, option)
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code, **kwargs)
    except ValueError as exc:
        raise _remote_code_error(exc, str(name), option) or exc


def _auto_class(kind: str):
    import transformers

    if kind not in ("AutoModel", "AutoModelForMaskedLM"):
        raise ValueError(f"unknown model class {kind}")
    return getattr(transformers, kind)


def load_model(name: str | os.PathLike, kind: str = "AutoModel", *, trust_remote_code: bool = False,
               option: str = "--model", **kwargs):
    """`AutoModel[ForMaskedLM].from_pretrained` with the remote-code rule and weights-only unpickling."""
    check_remote_code(name, trust_remote_code, option)
    check_pickle_weights(name, option)
    if kwargs.get("config") is not None:
        _check_loaded_config(kwargs["config"], str(name), trust_remote_code, option)
    try:
        if from_pretrained_takes_weights_only():  # 4.x has no such argument and always loads weights-only
            kwargs["weights_only"] = True
        return _auto_class(kind).from_pretrained(name, trust_remote_code=trust_remote_code, **kwargs)
    except Exception as exc:  # noqa: BLE001  only the two refusals are worded here; the rest is re-raised
        error = loader_refusal(exc, str(name), option)
        if error is None:
            raise
        raise error from None


def model_from_config(config, kind: str = "AutoModel", *, trust_remote_code: bool = False, option: str = "--model"):
    """`AutoModel[ForMaskedLM].from_config` (fresh weights) with the remote-code rule."""
    if getattr(config, "auto_map", None) and not trust_remote_code:
        raise UserError(f"{option}: the configuration asks to run code shipped with the model (auto_map: "
                        f"{_summary(config.auto_map)}); pass {TRUST_OPTION} if you trust its author")
    try:
        return _auto_class(kind).from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as exc:
        raise _remote_code_error(exc, option, option) or exc
