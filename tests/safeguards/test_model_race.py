"""The model boundary under a race: while a model loads, another thread keeps swapping one of its checked files for
a link to a different file outside the folder, a FIFO, or a deep JSON, and back. Every load either refuses in one
`UserError` or loads the folder's own files: never a hang, a traceback, or the outside file's content (the
libraries read only the private snapshot written from what was checked: encoder/source.py)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from mirrorbert.errors import UserError

OUTSIDE_TOKEN = "outsidetoken"
LOADS = 12


def _outside_copy(folder: Path, name: str, dest: Path) -> Path:
    """A copy of `name` that differs in a way a load would show: an extra vocabulary entry / config value."""
    data = json.loads((folder / name).read_text(encoding="utf-8"))
    if name == "tokenizer.json":
        vocab = data["model"]["vocab"]
        vocab[OUTSIDE_TOKEN] = max(vocab.values()) + 1
    else:
        data["outside_marker"] = OUTSIDE_TOKEN
    dest.write_text(json.dumps(data), encoding="utf-8")
    return dest


class Swapper(threading.Thread):
    """Swaps `path` for a hostile replacement and back, again and again, until stopped."""

    def __init__(self, path: Path, how: str, outside: Path):
        super().__init__(daemon=True)
        self.path, self.how, self.outside = path, how, outside
        self.original = path.read_bytes()
        self.stop = threading.Event()
        self.swaps = 0

    def _hostile(self, tmp: Path) -> None:
        if self.how == "link-out":
            os.symlink(self.outside, tmp)
        elif self.how == "fifo":
            os.mkfifo(tmp)
        else:
            tmp.write_bytes(b"[" * 100_000)

    def run(self) -> None:
        hostile, good = self.path.with_name(".hostile"), self.path.with_name(".good")
        while not self.stop.is_set():
            self._hostile(hostile)
            os.replace(hostile, self.path)
            time.sleep(0.0005)
            good.write_bytes(self.original)
            os.replace(good, self.path)
            self.swaps += 1
            time.sleep(0.0005)

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=10)
        tmp = self.path.with_name(".good")
        tmp.write_bytes(self.original)
        os.replace(tmp, self.path)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json"])
@pytest.mark.parametrize("how", ["link-out", "fifo", "deep-json"])
def test_a_file_swapped_during_the_load_is_refused_or_never_read(tiny_bert, tmp_path, name, how):
    from mirrorbert.encoder.model import Encoder

    folder = tmp_path / "model"
    shutil.copytree(tiny_bert, folder)
    outside = _outside_copy(folder, name, tmp_path / f"outside-{name}")
    swapper = Swapper(folder / name, how, outside)
    outcomes = {"refused": 0, "loaded": 0}
    swapper.start()
    try:
        for _ in range(LOADS):
            start = time.monotonic()
            try:
                encoder = Encoder.load(folder, device="cpu")
            except UserError as exc:
                assert "\n" not in str(exc) and str(folder) in str(exc), str(exc)
                outcomes["refused"] += 1
            else:
                assert OUTSIDE_TOKEN not in encoder.tokenizer.get_vocab(), "the tokenizer read the file outside"
                assert getattr(encoder.model.config, "outside_marker", None) is None, "the config read outside"
                outcomes["loaded"] += 1
            assert time.monotonic() - start < 30, "a load hung"
    finally:
        swapper.finish()
    assert swapper.swaps > 0 and sum(outcomes.values()) == LOADS, outcomes


def test_the_libraries_open_only_the_snapshot(tiny_bert, tmp_path, monkeypatch):
    """transformers and tokenizers are handed the private snapshot, never the folder's own paths."""
    import transformers

    from mirrorbert.encoder.model import Encoder

    seen: list[str] = []
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModel):
        original = cls.from_pretrained.__func__

        def spy(klass, path, *args, _original=original, **kwargs):
            seen.append(str(path))
            return _original(klass, path, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    Encoder.load(tiny_bert, device="cpu")
    assert seen and not any(str(tiny_bert) in path for path in seen), seen
    assert all(Path(path).name.startswith("mirrorbert-model-") for path in seen), seen
    assert not any(Path(path).exists() for path in seen)  # removed once the model is loaded


def test_one_check_per_load(tiny_bert):
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.safeguards.model_files import CHECKS

    before = CHECKS["model folders"]
    Encoder.load(tiny_bert, device="cpu")
    assert CHECKS["model folders"] - before == 1
