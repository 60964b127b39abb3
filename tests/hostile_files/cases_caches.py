"""Hostile checkpoints and caches of issue 34, "every folder a stranger hands over is confined" (ids `ck-`, `cc-`).

Checkpoints (`ck-`): a `step-N` whose manifest names a path that leads out (`..`, absolute, a link out), a FIFO,
or whose manifest is nested too deep or too big, named directly (one refusal naming the manifest and the path) or
found under a checkpoint root beside an intact older one (skipped with a warning, the older one resumed); its
own files (checkpoint.json, the training state, the gloss encoder) as links out, FIFOs, too deep or too big, with
the manifest rehashed to match.

Caches (`cc-`): the training token store (`$MIRRORBERT_CACHE/tokens/KEY/`) and the MLM token cache with a file
that is a link out or a FIFO, a manifest too deep or too big or naming other files, the cache folder a link, and
forged content (ids, strings, the strings left out, tokens, line ends, document starts) with the manifest rehashed:
each is set aside with one warning and rebuilt right; a link planted where the cache's own folder goes, a full
disk, a short write, a file too large, too many open files. Data edited while a run reads it: one error, nothing cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from hostile_files.harness import WORKS, Context, FileCase, Result

WHAT_CK = "hostile checkpoint"
WHAT_TOKENS = "forged or hostile token store"
WHAT_MLM = "forged or hostile MLM token cache"
WHAT_EDIT = "data edited while a run reads it"
HUGE = 100 << 20  # more than any bound on a checkpoint's or cache's JSON (a sparse file: no disk used)
DEEP = "[" * 100_000 + "]" * 100_000
TOKENLESS = "\u200b\u200b"  # no token under BERT's normaliser: a dropped string


# ----------------------------------------------------------------------------- small tools
def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _link_out(ctx: Context, path: Path) -> Path:
    """Move `path` out of its folder (a victim: it must stay as it is) and leave a link to it in its place."""
    outside = ctx.victim(ctx.folder / "outside" / path.name, path.read_bytes())
    path.unlink()
    path.symlink_to(outside)
    return outside


def _fifo(ctx: Context, path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _huge(ctx: Context, path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(HUGE)


def _deep(ctx: Context, path: Path) -> None:
    path.write_text(DEEP, encoding="utf-8")


ATTACKS: dict[str, Callable[[Context, Path], Any]] = {"link-out": _link_out, "fifo": _fifo, "deep-json": _deep,
                                                      "huge": _huge}


# ----------------------------------------------------------------------------- checkpoints
def _step(ctx: Context, name: str = "step-2", kind: str = "train") -> Path:
    from hostile_files.cases_code import reference_checkpoint

    dest = ctx.folder / "ck" / name
    shutil.copytree(reference_checkpoint(ctx.env, kind), dest)
    return dest


def _manifest(step: Path) -> dict:
    return json.loads((step / "manifest.json").read_text(encoding="utf-8"))


def _list(step: Path, name: str, target: Path | None) -> None:
    """Add `name` to the manifest, with the size and SHA-256 of `target` (what it would read, were it followed)."""
    manifest = _manifest(step)
    manifest["files"][name] = ({"size": target.stat().st_size, "sha256": _sha(target)} if target is not None
                               else {"size": 0, "sha256": "0" * 64})
    (step / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _rehash(step: Path, name: str) -> None:
    """The forger's last step: the manifest made to match the crafted file (when it is a regular file)."""
    path = step / name
    if path.is_file() and not path.is_symlink():
        _list(step, name, path)


def _entry_dotdot(ctx, step):
    _list(step, "../../outside.bin", ctx.victim(ctx.folder / "outside.bin", b"somebody else's file\n"))
    return "manifest.json names '../../outside.bin'"


def _entry_absolute(ctx, step):
    victim = ctx.victim(ctx.folder / "outside.bin", b"somebody else's file\n")
    _list(step, str(victim), victim)
    return "manifest.json names '/"


def _entry_link_out(ctx, step):
    victim = ctx.victim(ctx.folder / "outside.bin", b"somebody else's file\n")
    (step / "model" / "extra.bin").symlink_to(victim)
    _list(step, "model/extra.bin", victim)
    return "manifest.json names 'model/extra.bin'"


def _entry_fifo(ctx, step):
    os.mkfifo(step / "model" / "pipe")
    _list(step, "model/pipe", None)
    return "manifest.json names 'model/pipe'"


def _entry_deep(ctx, step):
    _deep(ctx, step / "manifest.json")
    return "manifest.json"


def _entry_huge(ctx, step):
    _huge(ctx, step / "manifest.json")
    return "manifest.json"


MANIFEST_ATTACKS = {"dotdot": _entry_dotdot, "absolute": _entry_absolute, "link-out": _entry_link_out,
                    "fifo": _entry_fifo, "deep-json": _entry_deep, "huge": _entry_huge}


def _named_names(attack: str) -> tuple[str, ...]:
    return {"dotdot": ("manifest.json names '../../outside.bin'",), "absolute": ("manifest.json names '/",),
            "link-out": ("manifest.json names 'model/extra.bin'",), "fifo": ("manifest.json names 'model/pipe'",),
            "deep-json": ("manifest.json",), "huge": ("manifest.json",)}[attack]


def _resume_api(ctx: Context, where: str = "ck/step-2"):
    """What a resumed run reads first: the checkpoint (verified) and its training state."""
    from mirrorbert.training.checkpoints import load_checkpoint, read_training_state

    checkpoint = load_checkpoint(ctx.folder / where)
    read_training_state(checkpoint.path)
    return checkpoint


def _older_one_resumed(ctx: Context, result: Result) -> str | None:
    checkpoint = result.value
    if checkpoint is None or checkpoint.path.name != "step-1":
        return f"resumed from {getattr(checkpoint, 'path', None)}, not the intact step-1"
    if not any(p.name.startswith("step-2.damaged-") for p in (ctx.folder / "ck").iterdir()):
        return "the hostile step-2 was not set aside"
    return None if "skipping" in result.err else "no warning about the hostile step-2"


def _checkpoint_manifest_cases() -> list[FileCase]:
    """Manifest entries x {.., absolute, link out, FIFO} and the manifest itself too deep or too big, for a
    `step-N` named directly (refused) and under a root beside an intact older one (skipped, the older resumed)."""
    cases = []
    for attack, craft in MANIFEST_ATTACKS.items():
        cases.append(FileCase(f"ck-manifest-{attack}-named", WHAT_CK, lambda ctx, craft=craft: craft(ctx, _step(ctx)),
                              _resume_api, names=_named_names(attack), timeout=60))

        def beside_intact(ctx, craft=craft):
            _step(ctx, "step-1")
            craft(ctx, _step(ctx, "step-2"))

        cases.append(FileCase(f"ck-manifest-{attack}-root-older-resumed", WHAT_CK, beside_intact,
                              lambda ctx: _resume_api(ctx, "ck"), expect=WORKS, check=_older_one_resumed,
                              timeout=60))
    return cases


def _checkpoint_file_cases() -> list[FileCase]:
    """checkpoint.json and the training state x {link out, FIFO, too deep, too big} (the safetensors file:
    link out and FIFO), each with the manifest rehashed to match."""
    cases = []
    files = {"checkpoint.json": ATTACKS, "training_state.json": ATTACKS,
             "training_state.safetensors": {k: ATTACKS[k] for k in ("link-out", "fifo")}}
    for name, attacks in files.items():
        for attack, craft in attacks.items():
            def setup(ctx, name=name, craft=craft):
                step = _step(ctx)
                craft(ctx, step / name)
                _rehash(step, name)

            cases.append(FileCase(f"ck-{name.replace('_', '-')}-{attack}-rehashed", WHAT_CK, setup,
                                  _resume_api, names=(name,), timeout=60))
    return cases


def _gloss_cases() -> list[FileCase]:
    """The gloss encoder's weights of a gloss-pretrain checkpoint as a link out or a FIFO, read by the gloss
    parts' own reader (its confinement alone, whatever the manifest says)."""
    cases = []
    for attack in ("link-out", "fifo"):
        def setup(ctx, attack=attack):
            step = _step(ctx, kind="gloss")
            ATTACKS[attack](ctx, step / "model" / "gloss_encoder.safetensors")

        def read(ctx):
            from mirrorbert.gloss.parts import _gloss_encoder_state

            return _gloss_encoder_state(ctx.folder / "ck" / "step-2" / "model")

        cases.append(FileCase(f"ck-gloss-encoder-{attack}", WHAT_CK, setup, read,
                              names=("gloss_encoder.safetensors",), timeout=60))
    return cases


def _cli_resume_cases(env) -> list[FileCase]:
    """The same refusals through the command line, before any model is loaded."""
    from hostile_files.cases_code import resume_argv

    cases = []
    for kind, attack in (("train", "dotdot"), ("mlm", "fifo")):
        def setup(ctx, kind=kind, attack=attack):
            MANIFEST_ATTACKS[attack](ctx, _step(ctx, kind=kind))

        cases.append(FileCase(f"ck-cli-{kind}-resume-manifest-{attack}", WHAT_CK, setup,
                              lambda ctx, kind=kind: resume_argv(ctx, kind, ctx.folder / "ck" / "step-2"),
                              names=_named_names(attack), timeout=120))
    return cases


# ----------------------------------------------------------------------------- the training token store
_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(env):
    from transformers import AutoTokenizer

    key = str(env["tiny"])
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(key)
    return _TOKENIZERS[key]


def _strings(ctx: Context) -> list[str]:
    lines = [line.strip() for line in ctx.env["data"].read_text(encoding="utf-8").splitlines() if line.strip()]
    return [TOKENLESS, *dict.fromkeys(lines)]


def _open_store(ctx: Context):
    from mirrorbert.data.readers import chunked
    from mirrorbert.data.strings import fingerprint
    from mirrorbert.data.token_store import open_token_store

    strings = _strings(ctx)
    return open_token_store(chunked(strings, 7), fingerprint(strings), _tokenizer(ctx.env), 16, ctx.folder / "cache")


def _store_root(ctx: Context) -> Path:
    return next(p for p in (ctx.folder / "cache").iterdir() if not p.name.startswith(".") and "." not in p.name)


def _store_right(ctx: Context, result: Result) -> str | None:
    """The store returned holds the strings and the tokenizer's ids of them; the hostile one was set aside with
    one warning."""
    from mirrorbert.mirror.views import tokenize_once

    store = result.value
    kept = _strings(ctx)[1:]
    try:
        if list(store.strings) != kept or store.token_ids(range(len(store))) != tokenize_once(
                _tokenizer(ctx.env), kept, 16):
            return "the store returned does not hold the strings' ids"
        if store.dropped != 1 or getattr(store, "dropped_texts", lambda: [TOKENLESS])() != [TOKENLESS]:
            return "the store returned does not hold the dropped string"
    except Exception as exc:  # noqa: BLE001  a hostile store that was used: the finding, not a crash
        return f"the store returned cannot be read: {type(exc).__name__}: {exc}"
    warnings = [line for line in result.err.splitlines() if "is damaged" in line]
    if len(warnings) != 1:
        return f"{len(warnings)} warnings about the hostile store, not one"
    if not any(".damaged-" in p.name for p in (ctx.folder / "cache").iterdir()):
        return "the hostile store was not set aside"
    return None


def _primed_store(damage: Callable[[Context, Path], Any]):
    def setup(ctx: Context) -> None:
        damage(ctx, _open_store(ctx).root)
    return setup


def _store_manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text(encoding="utf-8"))


def _store_rehash(root: Path, meta: dict | None = None, names: tuple[str, ...] = ()) -> None:
    meta = meta if meta is not None else _store_manifest(root)
    for name in names:
        meta["files"][name] = _sha(root / name)
    (root / "manifest.json").write_text(json.dumps(meta), encoding="utf-8")


def _forge_store_ids(ctx, root):
    """Every real id of the first string with tokens (row 1; row 0 is the string left out) replaced by another
    real id of the vocabulary, rehashed."""
    import numpy as np

    tok = _tokenizer(ctx.env)
    ids = np.fromfile(root / "ids.bin", dtype=np.int32)
    bounds = np.fromfile(root / "ids_offsets.bin", dtype=np.int64)
    first = ids[bounds[1]:bounds[2]]
    real = ~np.isin(first, sorted(tok.all_special_ids))
    first[real] = next(t for t in range(len(tok) - 1, 0, -1) if t not in tok.all_special_ids)
    ids[bounds[1]:bounds[2]] = first
    ids.tofile(root / "ids.bin")
    _store_rehash(root, names=("ids.bin",))


def _forge_store_text(ctx, root):
    """The strings' first letter changed (same length): the run would train on strings that are not the data's."""
    text = bytearray((root / "text.bin").read_bytes())
    text[0] = ord("x") if text[0] != ord("x") else ord("y")
    (root / "text.bin").write_bytes(bytes(text))
    _store_rehash(root, names=("text.bin",))


def _forge_store_swap(ctx, root):
    """Two strings swapped with their ids (rows 1 and 2; every count and checksum consistent): the tokens are the
    tokenizer's, of the wrong strings' places."""
    import numpy as np

    for stem in ("ids", "text"):
        dtype = np.int32 if stem == "ids" else np.uint8
        data = np.fromfile(root / f"{stem}.bin", dtype=dtype)
        off = np.fromfile(root / f"{stem}_offsets.bin", dtype=np.int64)
        a, b = data[off[1]:off[2]].copy(), data[off[2]:off[3]].copy()
        data[off[1]:off[1] + len(b)], data[off[1] + len(b):off[3]] = b, a
        off[2] = off[1] + len(b)
        data.tofile(root / f"{stem}.bin")
        off.tofile(root / f"{stem}_offsets.bin")
    _store_rehash(root, names=("ids.bin", "ids_offsets.bin", "text.bin", "text_offsets.bin"))


def _forge_store_dropped(ctx, root):
    """The list of strings left out emptied and the counts made to match: the string without tokens would be
    trained on."""
    meta = _store_manifest(root)
    (root / "dropped_at.bin").write_bytes(b"")
    meta["counts"]["dropped_at.bin"] = 0
    meta.update(dropped=0, strings=meta["read"], dropped_example=None)
    _store_rehash(root, meta, ("dropped_at.bin",))


def _store_folder_link(ctx, root):
    outside = ctx.folder / "outside-store"
    shutil.copytree(root, outside)
    shutil.rmtree(root)
    root.symlink_to(outside)


def _store_manifest_names_out(ctx, root):
    meta = _store_manifest(root)
    victim = ctx.victim(ctx.folder / "outside.bin", b"somebody else's file\n")
    meta["files"]["../../outside.bin"] = _sha(victim)
    _store_rehash(root, meta)


def _token_store_cases() -> list[FileCase]:
    cases = []
    for name in ("manifest.json", "ids.bin", "ids_offsets.bin", "text.bin", "text_offsets.bin", "dropped_at.bin"):
        for attack in ("link-out", "fifo"):
            cases.append(FileCase(f"cc-tokens-{name.replace('_', '-')}-{attack}", WHAT_TOKENS,
                                  _primed_store(lambda ctx, root, name=name, attack=attack:
                                                ATTACKS[attack](ctx, root / name)),
                                  _open_store, expect=WORKS, check=_store_right, timeout=60))
    more = {"manifest-deep-json": lambda ctx, root: _deep(ctx, root / "manifest.json"),
            "manifest-huge": lambda ctx, root: _huge(ctx, root / "manifest.json"),
            "manifest-names-a-path-out": _store_manifest_names_out,
            "store-folder-a-link-out": _store_folder_link,
            "forged-ids-rehashed": _forge_store_ids, "forged-text-rehashed": _forge_store_text,
            "forged-two-strings-swapped-rehashed": _forge_store_swap,
            "forged-dropped-strings-removed-rehashed": _forge_store_dropped}
    for id_, damage in more.items():
        cases.append(FileCase(f"cc-tokens-{id_}", WHAT_TOKENS, _primed_store(damage), _open_store, expect=WORKS,
                              check=_store_right, timeout=60))
    return cases


# ----------------------------------------------------------------------------- the MLM token cache
CORPUS = ("the cat sat on the mat\na dog ran in the park\n\nthe quick brown fox jumps over the lazy dog\n\n"
          "a man is playing a guitar\na woman is slicing an onion\n")


def _prepare(ctx: Context):
    from mirrorbert.data.token_stream import prepare_corpus

    return prepare_corpus(ctx.folder / "corpus.txt", _tokenizer(ctx.env), ctx.folder / "cache", eval_fraction=0.0,
                          show_progress=False)


def _mlm_root(ctx: Context) -> Path:
    return next(p for p in (ctx.folder / "cache").iterdir() if p.is_dir() and not p.name.startswith(".")
                and ".damaged-" not in p.name)


def _mlm_right(ctx: Context, result: Result) -> str | None:
    tok = _tokenizer(ctx.env)
    expected = []
    for line in CORPUS.splitlines():
        if line.strip():
            expected += tok(line.strip(), add_special_tokens=False)["input_ids"] + [tok.sep_token_id]
    try:
        if [int(t) for t in result.value.stream("train")] != expected:
            return "the cache's tokens are not the corpus's"
    except Exception as exc:  # noqa: BLE001  a hostile cache that was used: the finding, not a crash
        return f"the cache returned cannot be read: {type(exc).__name__}: {exc}"
    warnings = [line for line in result.err.splitlines() if "is damaged" in line]
    if len(warnings) != 1:
        return f"{len(warnings)} warnings about the hostile cache, not one"
    if not any(".damaged-" in p.name for p in (ctx.folder / "cache").iterdir()):
        return "the hostile cache was not set aside"
    return None


def _primed_mlm(damage: Callable[[Context, Path], Any]):
    def setup(ctx: Context) -> None:
        (ctx.folder / "corpus.txt").write_text(CORPUS, encoding="utf-8")
        _prepare(ctx)
        damage(ctx, _mlm_root(ctx))
    return setup


def _mlm_rehash(root: Path, *names: str) -> None:
    meta = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    for name in names:
        meta["files"][name] = _sha(root / name)
    (root / "manifest.json").write_text(json.dumps(meta), encoding="utf-8")


def _mlm_forge_tokens(ctx, root):
    import numpy as np

    tok = _tokenizer(ctx.env)
    tokens = np.fromfile(root / "train.tokens", dtype=np.uint16)
    tokens[0] = next(t for t in range(len(tok) - 1, 0, -1) if t != tokens[0] and t not in tok.all_special_ids)
    tokens.tofile(root / "train.tokens")
    _mlm_rehash(root, "train.tokens")


def _mlm_forge_sentences_swapped(ctx, root):
    """The first two sentences swapped in the stream and their line ends moved to match: the same tokens, each
    sentence still ending on a separator, in the wrong places."""
    import numpy as np

    tokens = np.fromfile(root / "train.tokens", dtype=np.uint16)
    ends = np.fromfile(root / "train.ends", dtype=np.uint64)
    a, b = int(ends[0]), int(ends[1])
    tokens[:b] = np.concatenate([tokens[a:b], tokens[:a]])
    ends[0] = b - a
    tokens.tofile(root / "train.tokens")
    ends.tofile(root / "train.ends")
    _mlm_rehash(root, "train.tokens", "train.ends")


def _mlm_forge_docs(ctx, root):
    import numpy as np

    docs = np.fromfile(root / "train.docs", dtype=np.uint64)
    docs[-1] -= 1
    docs.tofile(root / "train.docs")
    _mlm_rehash(root, "train.docs")


def _mlm_cases() -> list[FileCase]:
    cases = []
    for name in ("manifest.json", "train.tokens", "train.docs", "train.ends"):
        for attack in ("link-out", "fifo"):
            cases.append(FileCase(f"cc-mlm-{name.replace('.', '-')}-{attack}", WHAT_MLM,
                                  _primed_mlm(lambda ctx, root, name=name, attack=attack:
                                              ATTACKS[attack](ctx, root / name)),
                                  _prepare, expect=WORKS, check=_mlm_right, timeout=60))

    def folder_link(ctx, root):
        outside = ctx.folder / "outside-cache"
        shutil.copytree(root, outside)
        shutil.rmtree(root)
        root.symlink_to(outside)

    more = {"manifest-huge": lambda ctx, root: _huge(ctx, root / "manifest.json"),
            "cache-folder-a-link-out": folder_link,
            "forged-tokens-rehashed": _mlm_forge_tokens, "forged-sentences-swapped-rehashed":
                _mlm_forge_sentences_swapped, "forged-document-starts-rehashed": _mlm_forge_docs}
    for id_, damage in more.items():
        cases.append(FileCase(f"cc-mlm-{id_}", WHAT_MLM, _primed_mlm(damage), _prepare, expect=WORKS,
                              check=_mlm_right, timeout=60))
    return cases


# ----------------------------------------------------------------------------- data edited mid-run
@contextlib.contextmanager
def _patched(module, name: str, replacement):
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield original
    finally:
        setattr(module, name, original)


def _nothing_cached(cache: Path) -> None:
    """What a refused run must leave: no cache entry, no temporary (an AssertionError is the case's traceback)."""
    left = [p.name for p in cache.iterdir()] if cache.is_dir() else []
    assert not left, f"left in the cache: {left}"


@contextlib.contextmanager
def _cache_root(path: Path):
    before = os.environ.get("MIRRORBERT_CACHE")
    os.environ["MIRRORBERT_CACHE"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MIRRORBERT_CACHE", None)
        else:
            os.environ["MIRRORBERT_CACHE"] = before


def _train_strings_edited(ctx: Context):
    """The real path of `train`: the strings streamed from the file (`FileStrings`), fingerprinted, then the
    file edited before they are tokenised into the store."""
    from mirrorbert.data.strings import stream_training_strings
    from mirrorbert.mirror.train import training_store

    data = ctx.write("strings.txt", "".join(f"a training string number {i}\n" for i in range(12)))
    strings = stream_training_strings(data, seed=0)
    data.write_text("".join(f"an edited string number {i}\n" for i in range(12)), encoding="utf-8")
    try:
        with _cache_root(ctx.folder / "cache"):
            return training_store(strings, _tokenizer(ctx.env), 16)
    finally:
        _nothing_cached(ctx.folder / "cache" / "tokens")


def _corpus_edited_while_tokenised(ctx: Context):
    from mirrorbert.data.token_stream import CorpusLayout

    path = ctx.write("corpus.txt", CORPUS)
    try:
        with _patched(CorpusLayout, "write", None) as original:
            def edited(*args, **kwargs):
                path.write_text(CORPUS.replace("cat", "dog"), encoding="utf-8")
                return original(*args, **kwargs)

            CorpusLayout.write = edited
            return _prepare(ctx)
    finally:
        _nothing_cached(ctx.folder / "cache")


def _corpus_edited_while_cache_checked(ctx: Context):
    from mirrorbert.data.token_stream import CorpusLayout

    path = ctx.folder / "corpus.txt"
    try:
        with _patched(CorpusLayout, "replay", None) as original:
            def edited(*args, **kwargs):
                path.write_text(CORPUS.replace("cat", "dog"), encoding="utf-8")
                return original(*args, **kwargs)

            CorpusLayout.replay = edited
            return _prepare(ctx)
    finally:
        assert not any(".damaged-" in p.name for p in (ctx.folder / "cache").iterdir()), \
            "a corpus edited under the run is not a damaged cache"


def _edit_cases() -> list[FileCase]:
    return [
        FileCase("cc-tokens-data-edited-while-tokenised", WHAT_EDIT, None, _train_strings_edited,
                 names=("--data",), timeout=60),
        FileCase("cc-mlm-corpus-edited-while-tokenised", WHAT_EDIT, None, _corpus_edited_while_tokenised,
                 names=("corpus.txt",), timeout=60),
        FileCase("cc-mlm-corpus-edited-while-its-cache-is-checked", WHAT_EDIT, _primed_mlm(lambda ctx, root: None),
                 _corpus_edited_while_cache_checked, names=("corpus.txt",), timeout=60),
    ]


# ----------------------------------------------------------------------------- where the cache cannot be written
def _planted_link(folder_name: str):
    """The cache's own folder (`tokens/`, `mlm-corpus/`) a link to somebody else's folder."""
    def setup(ctx: Context) -> None:
        (ctx.folder / "corpus.txt").write_text(CORPUS, encoding="utf-8")
        ctx.victim(ctx.folder / "elsewhere" / "precious")
        (ctx.folder / "cache-root").mkdir()
        (ctx.folder / "cache-root" / folder_name).symlink_to(ctx.folder / "elsewhere")
    return setup


def _through_the_link(call):
    def action(ctx: Context):
        try:
            with _cache_root(ctx.folder / "cache-root"):
                return call(ctx)
        finally:
            left = sorted(p.name for p in (ctx.folder / "elsewhere").iterdir())
            assert left == ["precious"], f"written through the link: {left}"
    return action


def _default_store(ctx: Context):
    from mirrorbert.data.readers import chunked
    from mirrorbert.data.strings import fingerprint
    from mirrorbert.data.token_store import open_token_store

    strings = _strings(ctx)
    return open_token_store(chunked(strings, 7), fingerprint(strings), _tokenizer(ctx.env), 16)


def _default_corpus(ctx: Context):
    from mirrorbert.data.token_stream import prepare_corpus

    return prepare_corpus(ctx.folder / "corpus.txt", _tokenizer(ctx.env), eval_fraction=0.0, show_progress=False)


def _failing_disk(error: OSError, call):
    """`call` with every write of the cache's files failing with `error` (a full disk, numpy's short write)."""
    def action(ctx: Context):
        from mirrorbert.data.token_cache import ArrayWriter

        def fail(writer, fh, data):
            raise error

        (ctx.folder / "corpus.txt").write_text(CORPUS, encoding="utf-8")
        with _patched(ArrayWriter, "write", fail):
            return call(ctx)
    return action


def _too_many_open_files(ctx: Context):
    """A valid store opened with no descriptor left (`ulimit -n`): an error, never damage."""
    import resource

    from mirrorbert.data.readers import chunked
    from mirrorbert.data.strings import fingerprint
    from mirrorbert.data.token_store import open_token_store

    strings, tokenizer = _strings(ctx), _tokenizer(ctx.env)
    args = (chunked(strings, 7), fingerprint(strings), tokenizer, 16, ctx.folder / "cache")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))  # the next open fails with EMFILE
    try:
        return open_token_store(*args)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert not any(".damaged-" in p.name for p in (ctx.folder / "cache").iterdir()), \
            "a store that could not be opened was set aside as damaged"


def _failure_cases() -> list[FileCase]:
    import errno

    what = "a cache that cannot be written or opened"
    full, short = OSError(errno.ENOSPC, "No space left on device"), OSError("98852 requested and 51200 written")
    return [
        FileCase("cc-tokens-folder-a-planted-link", what, _planted_link("tokens"), _through_the_link(_default_store),
                 names=("tokens",), timeout=60),
        FileCase("cc-mlm-folder-a-planted-link", what, _planted_link("mlm-corpus"),
                 _through_the_link(_default_corpus), names=("mlm-corpus",), timeout=60),
        FileCase("cc-tokens-disk-full", what, None, _failing_disk(full, _open_store), names=("MIRRORBERT_CACHE",),
                 timeout=60),
        FileCase("cc-tokens-short-write", what, None, _failing_disk(short, _open_store),
                 names=("MIRRORBERT_CACHE",), timeout=60),
        FileCase("cc-mlm-disk-full", what, None, _failing_disk(full, _prepare), names=("--cache-dir",), timeout=60),
        FileCase("cc-tokens-too-many-open-files", what, _primed_store(lambda ctx, root: None), _too_many_open_files,
                 names=("Too many open files",), timeout=60),
    ]


def cases(env) -> list[FileCase]:
    return [*_checkpoint_manifest_cases(), *_checkpoint_file_cases(), *_gloss_cases(), *_cli_resume_cases(env),
            *_token_store_cases(), *_mlm_cases(), *_edit_cases(), *_failure_cases()]
