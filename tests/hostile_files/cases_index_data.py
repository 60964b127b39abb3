"""Hostile files of issue 34, "every folder a stranger hands over is confined": index folders (ids `ix-`) and
data files, saved dataset folders and `hf:` names (ids `ds-`).

Generated where the threat is a product: every file of an index folder x {a link leading out to a copy of the
same bytes (every checksum still matches), a FIFO, a link to /dev/zero, a folder}; every path a dataset folder
names x {`..`, an absolute path, a link out, a FIFO, /dev/zero, a folder}; every data option x {a FIFO, a line
with no end, a million-column header}; the manifest fields that change results x {edited}; `hf:` names that
read as paths. Issue 42's open cases: every claim of an index against what can check it (texts dropped or
rewritten, ids past the corpus's end, a maximum length the vectors disprove), a corpus that cannot be read, a
table's string that is not UTF-8. Each ends in one clean refusal naming the file (or option), or in correct work
whose output is checked (texts with terminal control characters come out escaped).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import threading
import time
from pathlib import Path

from hostile_files.cases_readback import _base_index, _base_ivf_index, _manifest, _write_manifest
from hostile_files.harness import REFUSED, WORKS, Context, FileCase

QUIET = ["--no-progress"]
FIFO_TIMEOUT = 20.0
UNSAFE = "\x1b\x07\r\x9b\u202e\u2028"


# ----------------------------------------------------------------------------- helpers
def _fifo(path: Path, rescue_after: float = FIFO_TIMEOUT + 5) -> Path:
    """A FIFO no writer opens, and a thread that opens and closes its write end after `rescue_after` seconds:
    a reader blocked on it (in C++, deaf to the alarm) then reads end-of-file, so a regression is a `hang`
    outcome instead of a table that never ends."""
    os.mkfifo(path)

    def rescue():
        time.sleep(rescue_after)
        for _ in range(60):
            with contextlib.suppress(OSError):  # ENXIO: no reader blocked on it; ENOENT: the case is gone
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            time.sleep(1)

    threading.Thread(target=rescue, daemon=True).start()
    return path


def _index(ctx: Context, base=_base_index) -> Path:
    dest = ctx.folder / "index"
    shutil.copytree(base(ctx.env), dest)
    return dest


def _rehash(folder: Path, name: str) -> None:
    data = _manifest(folder)
    data["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    _write_manifest(folder, data)


def _npy(array) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _search(ctx: Context, *extra) -> list:
    return ["search", "--index", ctx.folder / "index", "--model", ctx.env["tiny"], "--query", "a query", *extra,
            *QUIET]


def _captured(argv: list) -> dict:
    """Run a command, keeping its output: {"rc", "out"} (a dict: a list would be taken for a command line)."""
    from mirrorbert.cli.app import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(a) for a in argv])
    return {"rc": code, "out": out.getvalue()}


# ----------------------------------------------------------------------------- index folders
MEMBERS = ("vectors.npy", "texts.jsonl", "ids.npy", "faiss.index", "manifest.json")
IVF_MEMBERS = ("ivf_centroids.npy", "ivf_sq.npy", "ivf_lists.npy")


def _member_attack(name: str, attack: str, base=_base_index):
    def setup(ctx: Context):
        folder = _index(ctx, base)
        path = folder / name
        if attack == "link-out":  # the same bytes, elsewhere: the checksums all match
            outside = ctx.folder / f"outside-{name}"
            shutil.move(path, outside)
            os.symlink(outside, path)
            return
        path.unlink()
        if attack == "fifo":
            _fifo(path)
        elif attack == "dev-zero":
            os.symlink("/dev/zero", path)
        elif attack == "folder":
            path.mkdir()
    return setup


def _edited(base=_base_index, **changes):
    def setup(ctx: Context):
        folder = _index(ctx, base)
        _write_manifest(folder, {**_manifest(folder), **changes})
    return setup


def _replaced(name: str, make):
    """Replace a file with `make(folder)`'s bytes and rehash it, as a tamperer who knows the format would."""
    def setup(ctx: Context):
        folder = _index(ctx)
        (folder / name).write_bytes(make(folder))
        _rehash(folder, name)
    return setup


def _index_cases(env) -> list[FileCase]:
    W = "index folder leading out or lying"
    cases: list[FileCase] = []

    def refused(id_, setup, names, action=None, timeout=60.0):
        cases.append(FileCase(f"ix-{id_}", W, setup, action or (lambda ctx: _search(ctx)), names=names,
                              timeout=timeout))

    for name in MEMBERS:
        for attack in ("link-out", "fifo", "dev-zero", "folder"):
            refused(f"{name}-{attack}", _member_attack(name, attack), (name,), timeout=FIFO_TIMEOUT)
    for name in IVF_MEMBERS:
        refused(f"{name}-link-out", _member_attack(name, "link-out", _base_ivf_index), (name,))

    def files_key(key):
        def setup(ctx):
            folder = _index(ctx)
            data = _manifest(folder)
            data["files"][key.replace("ABS", str(ctx.folder))] = data["files"]["vectors.npy"]
            _write_manifest(folder, data)
        return setup

    for id_, key in (("dotdot", "../vectors.npy"), ("absolute", "ABS/vectors.npy"), ("inner-dotdot", "x/../ids.npy")):
        refused(f"manifest-files-key-{id_}", files_key(key), ("manifest.json",))

    M = ("manifest.json",)
    refused("manifest-pooling-cls", _edited(pooling="cls"), ("vectors.npy row", "pooling 'cls'"))
    refused("manifest-pooling-not-ours", _edited(pooling="max"), M)
    refused("manifest-max-length-4", _edited(max_length=4), ("vectors.npy row", "max_length 4"))
    refused("manifest-max-length-beyond-the-model", _edited(max_length=10**6), ("max_length 1000000",))
    refused("manifest-max-length-0", _edited(max_length=0), M)
    refused("manifest-normalized-false", _edited(normalized=False), M)
    refused("manifest-normalized-a-string", _edited(normalized="yes"), M)
    refused("manifest-model-fingerprint-other", _edited(model_sha256="0" * 64), ("built by another model",))
    refused("manifest-model-name-escape-sequence", _edited(model="\x1b]0;owned\x07model"), M)
    refused("manifest-corpus-path-escape-sequence", _edited(corpus="/tmp/\x1b[2Jcorpus.txt"), M)
    refused("option-pooling-other-than-the-manifest", _index, ("--pooling",),
            action=lambda ctx: _search(ctx, "--pooling", "cls"))
    refused("option-max-length-other-than-the-manifest", _index, ("--max-length",),
            action=lambda ctx: _search(ctx, "--max-length", "8"))

    import numpy as np

    refused("vectors-scaled-rehashed", _replaced("vectors.npy", lambda f: _npy(np.load(f / "vectors.npy") * 3)),
            ("vectors.npy",))
    refused("vectors-rows-swapped-rehashed-exact-scan",  # unit rows, finite, the right shape: the model disagrees
            _replaced("vectors.npy", lambda f: _npy(np.load(f / "vectors.npy")[::-1].copy())), ("vectors.npy row",),
            action=lambda ctx: _search(ctx, "--faiss", "no"))

    def with_corpus(ctx):
        corpus = ctx.folder / "corpus.txt"
        shutil.copy(ctx.env["data"], corpus)
        return _search(ctx, "--corpus", corpus)

    def swapped_texts(folder):
        lines = (folder / "texts.jsonl").read_bytes().splitlines(keepends=True)
        return lines[1] + lines[0] + b"".join(lines[2:])

    refused("corpus-given-texts-swapped-rehashed", _replaced("texts.jsonl", swapped_texts), ("texts.jsonl:1",),
            action=with_corpus)

    def shifted_ids(folder):
        ids = np.load(folder / "ids.npy")
        return _npy(np.concatenate([ids[:-1], [ids[-1] + 1]]).astype(np.int64))

    def with_extra_line(ctx):  # the corpus grows by a line; the manifest is edited to agree with it
        corpus = ctx.folder / "corpus.txt"
        corpus.write_bytes(Path(ctx.env["data"]).read_bytes() + b"one more line\n")
        folder = ctx.folder / "index"
        data = _manifest(folder)
        data.update(corpus=str(corpus), corpus_bytes=corpus.stat().st_size, corpus_lines=data["corpus_lines"] + 1,
                    corpus_sha256=hashlib.sha256(corpus.read_bytes()).hexdigest())
        _write_manifest(folder, data)
        return _search(ctx, "--corpus", corpus)

    refused("corpus-given-last-id-shifted-rehashed", _replaced("ids.npy", shifted_ids), ("ids.npy",),
            action=with_extra_line)
    refused("corpus-given-one-record-more-than-rows", _index, ("--corpus",), action=with_extra_line)

    cases.extend(_dataset_corpus_cases(W, refused))
    cases.extend(_escape_cases(env))
    return cases


def _dataset_corpus_cases(W, refused) -> list[FileCase]:
    """An index over a saved dataset folder: the folder is hashed through the confined reader."""
    def built(extra):
        def setup(ctx: Context):
            import datasets

            datasets.Dataset.from_dict({"text": ["a cat", "a dog", "the fox"]}).save_to_disk(str(ctx.folder / "ds"))
            with contextlib.redirect_stderr(io.StringIO()):
                assert _captured(["index", "--model", ctx.env["tiny"], "--corpus", ctx.folder / "ds", "--output",
                                  ctx.folder / "index", *QUIET])["rc"] == 0
            extra(ctx, ctx.folder / "ds")
        return setup

    def link_out(ctx, ds):
        (ctx.folder / "secret.txt").write_text("not the dataset's\n", encoding="utf-8")
        os.symlink(ctx.folder / "secret.txt", ds / "notes.txt")

    refused("dataset-corpus-link-out-added", built(link_out), ("notes.txt",))
    refused("dataset-corpus-fifo-added", built(lambda ctx, ds: _fifo(ds / "pipe")), ("pipe",), timeout=FIFO_TIMEOUT)
    return []


def _escape_cases(env) -> list[FileCase]:
    """Hit texts, queries and ids printed by `search`: whatever a file holds, no raw control character."""
    lines = ["plain words here", "red \x1b[31m alert \x1b]0;title\x07", "csi \x9b2J clear screen",
             "right\u202eto left", "line\u2028separator", "bell\x07 ring"]

    def setup(ctx: Context):
        (ctx.folder / "evil.txt").write_bytes("\n".join(lines).encode("utf-8") + b"\n")
        with contextlib.redirect_stderr(io.StringIO()):
            assert _captured(["index", "--model", ctx.env["tiny"], "--corpus", ctx.folder / "evil.txt", "--output",
                              ctx.folder / "index", *QUIET])["rc"] == 0

    def check(ctx, result) -> str | None:
        out = result.value["out"]
        if result.value["rc"] != 0:
            return f"rc {result.value['rc']}"
        if any(c in out for c in UNSAFE):
            return f"raw control characters printed: {out[:200]!r}"
        hits = [h["text"] for line in out.splitlines() for h in json.loads(line)["hits"]]
        return None if set(hits) == set(lines) else f"hit texts changed: {hits!r}"

    cases = []
    for id_, extra in (("index", ["--index", "INDEX"]), ("index-and-corpus", ["--index", "INDEX", "--corpus", "CORPUS"]),
                       ("corpus", ["--corpus", "CORPUS"])):
        def action(ctx, extra=extra):
            argv = [str(ctx.folder / "index") if a == "INDEX" else str(ctx.folder / "evil.txt") if a == "CORPUS"
                    else a for a in extra]
            return _captured(["search", *argv, "--model", ctx.env["tiny"], "--query", "alert \x1b[2J", "--top-k",
                              str(len(lines)), *QUIET])

        cases.append(FileCase(f"ix-search-{id_}-texts-with-control-characters-printed-escaped",
                              "terminal escape injection", setup, action, expect=WORKS, check=check))
    return cases


# ----------------------------------------------------------------------------- data options
def _option_commands(env):
    """(id, option, command maker) for each data option: the maker takes the path and the extra options."""
    tiny = env["tiny"]

    def corpus_file(ctx):
        path = ctx.folder / "c.txt"
        path.write_text("one\ntwo\nthree\n", encoding="utf-8")
        return path

    return [
        ("train-data", "--data", lambda ctx, p, x: ["train", "--model", tiny, "--data", p, "--output",
                                                    ctx.folder / "out", "--steps", "1", *x, *QUIET]),
        ("encode-input", "--input", lambda ctx, p, x: ["encode", "--model", tiny, "--input", p, "--output",
                                                       ctx.folder / "v.npy", *x, *QUIET]),
        ("search-corpus", "--corpus", lambda ctx, p, x: ["search", "--model", tiny, "--corpus", p, "--query", "q",
                                                         *x, *QUIET]),
        ("index-corpus", "--corpus", lambda ctx, p, x: ["index", "--model", tiny, "--corpus", p, "--output",
                                                        ctx.folder / "idx", *x, *QUIET]),
        ("search-queries", "--queries", lambda ctx, p, x: ["search", "--model", tiny, "--corpus", corpus_file(ctx),
                                                           "--queries", p, *x, *QUIET]),
    ]


def _data_option_cases(env) -> list[FileCase]:
    W = "data file that never ends"
    cases: list[FileCase] = []

    def endless(ctx, path):
        with open(path, "wb") as fh:  # 2 GB without a line end, sparse: nothing is written
            fh.truncate(2 << 30)

    def wide(ctx, path):
        path.write_text(",".join(f"c{i}" for i in range(1_000_000)) + "\n" + "x\n" * 1000, encoding="utf-8")

    attacks = [("fifo-txt", "data.txt", lambda ctx, p: _fifo(p), []),
               ("fifo-parquet", "data.parquet", lambda ctx, p: _fifo(p), []),
               ("endless-line", "data.txt", endless, []),
               ("million-column-csv-header", "data.csv", wide, ["--column", "c0"])]
    for command_id, option, command in _option_commands(env):
        for attack_id, name, make, extra in attacks:
            def setup(ctx, name=name, make=make):
                make(ctx, ctx.folder / name)

            def action(ctx, name=name, extra=extra, command=command):
                return command(ctx, ctx.folder / name, extra)

            cases.append(FileCase(f"ds-{command_id}-{attack_id}", W, setup, action, names=(name,),
                                  timeout=FIFO_TIMEOUT))
    return cases


# ----------------------------------------------------------------------------- saved dataset folders
def _saved(ctx: Context) -> Path:
    import datasets

    folder = ctx.folder / "saved"
    datasets.Dataset.from_dict({"text": [f"sentence number {i}" for i in range(6)]}).save_to_disk(
        str(folder), num_shards=2)
    (ctx.folder / "outside.arrow").write_bytes((folder / "data-00000-of-00002.arrow").read_bytes())
    return folder


def _state(folder: Path, change) -> None:
    state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    change(state)
    (folder / "state.json").write_text(json.dumps(state), encoding="utf-8")


def _shard_attack(attack: str):
    def setup(ctx: Context):
        folder = _saved(ctx)
        shard = folder / "data-00000-of-00002.arrow"

        def name(value):
            _state(folder, lambda s: s["_data_files"][0].update(filename=value))

        if attack == "dotdot":
            name("../outside.arrow")
        elif attack == "absolute":
            name(str(ctx.folder / "outside.arrow"))
        else:
            shard.unlink()
            {"link-out": lambda: os.symlink(ctx.folder / "outside.arrow", shard), "fifo": lambda: _fifo(shard),
             "dev-zero": lambda: os.symlink("/dev/zero", shard), "folder": shard.mkdir}[attack]()
    return setup


def _folder_json_attack(name: str, attack: str):
    def setup(ctx: Context):
        path = _saved(ctx) / name
        if attack == "not-a-list":
            _state(path.parent, lambda s: s.update(_data_files="data-00000-of-00002.arrow"))
            return
        path.unlink()
        if attack == "link-out":
            (ctx.folder / f"outside-{name}").write_text("{}", encoding="utf-8")
            os.symlink(ctx.folder / f"outside-{name}", path)
        elif attack == "fifo":
            _fifo(path)
        elif attack == "deep":
            path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    return setup


def _dataset_folder_cases(env) -> list[FileCase]:
    W = "dataset folder naming paths out of it"
    tiny = env["tiny"]
    cases: list[FileCase] = []
    commands = {
        "encode": lambda ctx: ["encode", "--model", tiny, "--input", ctx.folder / "saved", "--output",
                               ctx.folder / "v.npy", *QUIET],
        "search": lambda ctx: ["search", "--model", tiny, "--corpus", ctx.folder / "saved", "--query", "q", *QUIET],
        "train": lambda ctx: ["train", "--model", tiny, "--data", ctx.folder / "saved", "--output", ctx.folder / "m",
                              "--steps", "1", *QUIET],
    }
    for attack in ("dotdot", "absolute", "link-out", "fifo", "dev-zero", "folder"):
        for command in ("encode", "search"):
            cases.append(FileCase(f"ds-state-data-file-{attack}-{command}", W, _shard_attack(attack),
                                  commands[command], names=("state.json",), timeout=FIFO_TIMEOUT))
    for name in ("state.json", "dataset_info.json"):
        for attack in ("link-out", "fifo", "deep"):
            cases.append(FileCase(f"ds-{name}-{attack}-train", W, _folder_json_attack(name, attack),
                                  commands["train"], names=(name,), timeout=FIFO_TIMEOUT))
    cases.append(FileCase("ds-state.json-data-files-not-a-list-train", W,
                          _folder_json_attack("state.json", "not-a-list"), commands["train"], names=("state.json",)))

    def reads_all(ctx, result) -> str | None:
        out = result.value["out"]
        hits = [h["text"] for line in out.splitlines() for h in json.loads(line)["hits"]] if result.value["rc"] == 0 else []
        return None if sorted(hits) == [f"sentence number {i}" for i in range(6)] else f"read {hits!r}"

    cases.append(FileCase("ds-saved-folder-of-two-shards-reads-every-row", W, _saved,
                          lambda ctx: _captured(["search", "--model", tiny, "--corpus", ctx.folder / "saved",
                                                 "--query", "q", "--top-k", "10", *QUIET]),
                          expect=WORKS, check=reads_all))
    return cases


# ----------------------------------------------------------------------------- hf: is the Hub
def _hub_cases(env) -> list[FileCase]:
    """`hf:` names that would read a local path: refused, or answered by the Hub alone (offline here: refused
    as unreachable, where the old reader answered from the local folder)."""
    W = "hf: name that reads as a local path"
    tiny = env["tiny"]
    cases: list[FileCase] = []

    def plant(ctx: Context):
        """What a local-path reading would find, in the working folder the command runs in."""
        cwd = Path(os.getcwd())
        (cwd / "someone" / "sentences").mkdir(parents=True, exist_ok=True)
        for folder in (cwd, cwd / "someone" / "sentences", ctx.folder):
            (folder / "data.csv").write_text("text\nlocal line one\nlocal line two\nlocal three\n", encoding="utf-8")

    specs = [("dotdot", "hf:../someone/sentences", "--data"), ("absolute", "hf:/etc/passwd", "--input"),
             ("home", "hf:~/data", "--corpus"), ("dot", "hf:./someone/sentences", "--queries"),
             ("packaged-csv", "hf:csv", "--input"), ("packaged-json", "hf:json", "--data"),
             ("same-name-as-a-local-folder", "hf:someone/sentences", "--input"),
             ("same-name-as-a-local-folder-train", "hf:someone/sentences", "--data")]
    for id_, spec, option in specs:
        def action(ctx, spec=spec, option=option):
            plant(ctx)
            if option == "--data":
                return ["train", "--model", tiny, "--data", spec, "--column", "text", "--output", ctx.folder / "m",
                        "--steps", "1", *QUIET]
            if option == "--input":
                return ["encode", "--model", tiny, "--input", spec, "--column", "text", "--output",
                        ctx.folder / "v.npy", *QUIET]
            if option == "--corpus":
                return ["search", "--model", tiny, "--corpus", spec, "--column", "text", "--query", "q", *QUIET]
            return ["search", "--model", tiny, "--corpus", ctx.folder / "data.csv", "--column", "text", "--queries",
                    spec, *QUIET]

        cases.append(FileCase(f"ds-hf-{id_}", W, None, action, names=(spec,), timeout=60))
    return cases


# ----------------------------------------------------------------------------- claims against what proves them
def _claim_cases(env) -> list[FileCase]:
    """Issue 42's open cases: each claim of an index checked against what can check it (the corpus's lines and
    line count, the vectors' encoding settings), a corpus that cannot be read said so, a table's string that is
    not UTF-8 named by its row."""
    import numpy as np

    W = "index folder leading out or lying"
    cases: list[FileCase] = []

    def refused(id_, setup, names, action=None):
        cases.append(FileCase(f"ix-{id_}", W, setup, action or (lambda ctx: _search(ctx)), names=names))

    def with_corpus(ctx):
        return _search(ctx, "--corpus", ctx.env["data"])

    def texts_dropped(**changes):
        def setup(ctx):
            folder = _index(ctx)
            (folder / "texts.jsonl").unlink()
            _write_manifest(folder, {**_manifest(folder), "texts": False, **changes})
        return setup

    T = ("'texts' false",)
    refused("corpus-given-texts-dropped-from-the-manifest", texts_dropped(), T, action=with_corpus)
    refused("index-manifest-max-length-3-texts-dropped", texts_dropped(max_length=3), T)
    refused("index-manifest-pooling-cls-texts-dropped", texts_dropped(pooling="cls"), T)
    refused("index-manifest-max-length-3", _edited(max_length=3), ("vectors.npy row", "max_length 3"))

    def rewritten_in_place(ctx):
        from mirrorbert.search.exact import SearchIndex

        index = SearchIndex.load(ctx.folder / "index", use_faiss=False)
        path = ctx.folder / "index" / "texts.jsonl"
        first = path.read_bytes().index(b"\n")
        with open(path, "r+b") as fh:  # the same file and length, another text: no checksum is read again
            fh.write(b'"' + b"x" * (first - 2) + b'"')
        return index.texts[0]

    cases.append(FileCase("ix-api-index-texts-rewritten-in-place-after-the-check", W, _index, rewritten_in_place,
                          names=("texts.jsonl:1",)))

    def id_past_the_end(ctx):
        folder = _index(ctx)
        ids = np.load(folder / "ids.npy")
        (folder / "ids.npy").write_bytes(_npy(np.concatenate([ids[:-1], [ids[-1] + 30]]).astype(np.int64)))
        _rehash(folder, "ids.npy")
        data = _manifest(folder)
        _write_manifest(folder, {**data, "corpus_lines": data["corpus_lines"] + 40})

    L = ("corpus_lines",)
    refused("corpus-lines-inflated-id-past-the-corpus-end", id_past_the_end, L)
    refused("corpus-given-lines-inflated-id-past-the-corpus-end", id_past_the_end, L, action=with_corpus)
    cases.append(FileCase("ix-index-max-length-3-fixed-spot-rows-re-encoded", W, _fixed_spot_rows_forged,
                          lambda ctx: _search(ctx, "--faiss", "no"), names=("vectors.npy row",), timeout=120))

    R = ("/proc/self/mem: cannot be read",)
    if os.path.exists("/proc/self/mem"):
        refused("corpus-given-proc-self-mem", _index, R, action=lambda ctx: _search(ctx, "--corpus", "/proc/self/mem"))

        def named_without_size(ctx):
            folder = _index(ctx)
            data = {**_manifest(folder), "corpus": "/proc/self/mem"}
            del data["corpus_bytes"]
            _write_manifest(folder, data)

        refused("corpus-named-proc-self-mem-size-dropped", named_without_size, R)
        refused("index-corpus-proc-self-mem", None, R, action=lambda ctx: [
            "index", "--model", ctx.env["tiny"], "--corpus", "/proc/self/mem", "--output", ctx.folder / "idx", *QUIET])
    return cases


def _fixed_spot_rows_forged(ctx: Context) -> None:
    """An index of 300 lines whose rows a fixed spot check would re-encode (the longest, some spread evenly) are
    re-made with max_length 3, its manifest edited to 3 and rehashed."""
    import numpy as np

    from mirrorbert.encoder.model import Encoder

    words = "the cat sat on a mat dog ran in park bank raised rates".split()
    lines = [" ".join(words[(i + k) % len(words)] for k in range(2 + i % 9)) + f" {i}" for i in range(300)]
    corpus = ctx.write("corpus.txt", "\n".join(lines) + "\n")
    folder = ctx.folder / "index"
    with contextlib.redirect_stderr(io.StringIO()):
        assert _captured(["index", "--model", ctx.env["tiny"], "--corpus", corpus, "--output", folder,
                          *QUIET])["rc"] == 0
    lengths = np.array([len(json.dumps(t)) + 1 for t in lines])
    forged = sorted(set(np.argsort(-lengths, kind="stable")[:4].tolist())
                    | set(np.linspace(0, len(lines) - 1, num=4).astype(int).tolist()))
    vectors = np.load(folder / "vectors.npy")
    vectors[forged] = Encoder.load(str(ctx.env["tiny"]), pooling="mean", max_length=3).encode(
        [lines[r] for r in forged], normalize=True)
    (folder / "vectors.npy").write_bytes(_npy(vectors.astype(np.float32)))
    _rehash(folder, "vectors.npy")
    (folder / "faiss.index").unlink(missing_ok=True)
    data = _manifest(folder)
    data["files"].pop("faiss.index", None)
    _write_manifest(folder, {**data, "max_length": 3, "faiss": False})


def _table_text_cases(env) -> list[FileCase]:
    """A Parquet or Arrow string column holding bytes that are not UTF-8 (a lone surrogate's): one line naming the
    file and the row, from every command that reads data."""
    W = "crafted data file"
    tiny = env["tiny"]

    def make(kind):
        def setup(ctx: Context):
            import pyarrow as pa
            import pyarrow.parquet as pq

            column = pa.array([b"plain text", b"a lone \xed\xa0\x80 surrogate", b"after"], pa.binary()).view(pa.string())
            table = pa.table({"text": column})
            if kind == "parquet":
                pq.write_table(table, ctx.folder / "data.parquet")
            else:
                with pa.ipc.new_stream(str(ctx.folder / "data.arrow"), table.schema) as writer:
                    writer.write_table(table)
        return setup

    commands = {
        "encode": lambda ctx, p: ["encode", "--input", p, "--output", ctx.folder / "v.npy"],
        "train": lambda ctx, p: ["train", "--data", p, "--output", ctx.folder / "m", "--steps", "1"],
        "search": lambda ctx, p: ["search", "--corpus", p, "--query", "q"],
        "index": lambda ctx, p: ["index", "--corpus", p, "--output", ctx.folder / "idx"],
    }
    cases = []
    for kind in ("parquet", "arrow"):
        for name, command in commands.items():
            def action(ctx, kind=kind, command=command):
                return [*command(ctx, ctx.folder / f"data.{kind}"), "--model", tiny, "--column", "text", *QUIET]

            cases.append(FileCase(f"ds-{kind}-lone-surrogate-{name}", W, make(kind), action,
                                  names=(f"data.{kind}: row 1: column 'text' is not UTF-8",)))
    return cases


def cases(env) -> list[FileCase]:
    return [*_index_cases(env), *_claim_cases(env), *_data_option_cases(env), *_dataset_folder_cases(env),
            *_hub_cases(env), *_table_text_cases(env)]
