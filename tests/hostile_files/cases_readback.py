"""Hostile files of issue 26, "what is read back is checked against its manifest" (ids `read:`).

Tampered index folders (manifest, vectors.npy, ids.npy, texts.jsonl, faiss.index, the corpus the manifest
names), MLM token caches that are damaged or stale, crafted CSV/TSV/JSONL/Parquet/Arrow inputs, evaluation
gold files with NaN/infinite/out-of-range scores in a copy of the data-directory layout, configs with absurd
sizes, 20-digit seeds, and Python calls with mismatched inputs. Each ends in one clean refusal naming the file
(or the argument) or in correct work.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

from hostile_files.harness import REFUSED, WORKS, Context, FileCase

QUIET = ["--no-progress"]


# ----------------------------------------------------------------------------- helpers
def _cli(argv: list) -> int:
    from mirrorbert.cli.app import main

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return main([str(a) for a in argv])


def _base_index(env) -> Path:
    """One index of the tiny model over the shared strings file, built once for the whole table."""
    base = Path(env["root"]) / "readback-base-index"
    if not (base / "manifest.json").is_file():
        code = _cli(["index", "--model", env["tiny"], "--corpus", env["data"], "--output", base, *QUIET])
        assert code == 0, "building the base index failed"
    return base


def _base_ivf_index(env) -> Path:
    """An approximate (IVF) index of the same strings, built once."""
    base = Path(env["root"]) / "readback-base-ivf-index"
    if not (base / "manifest.json").is_file():
        code = _cli(["index", "--model", env["tiny"], "--corpus", env["data"], "--output", base,
                     "--index-type", "ivf", *QUIET])
        assert code == 0, "building the base IVF index failed"
    return base


def _index(ctx: Context, name: str = "index", base=_base_index) -> Path:
    dest = ctx.folder / name
    shutil.copytree(base(ctx.env), dest)
    return dest


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))


def _write_manifest(folder: Path, data: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(data), encoding="utf-8")


def _tamper(ctx: Context, name: str, content: bytes | str, rehash: bool = True, base=_base_index) -> Path:
    """Replace one index file; with `rehash` the manifest's checksum is updated too (a tamperer who knows the
    format), so the structural checks are what must catch it."""
    folder = _index(ctx, base=base)
    path = folder / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    if rehash and "files" in _manifest(folder):
        data = _manifest(folder)
        data["files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
        _write_manifest(folder, data)
    return folder


def _edit_manifest(ctx: Context, base=_base_index, **changes) -> Path:
    folder = _index(ctx, base=base)
    data = _manifest(folder)
    for key, value in changes.items():
        if value is _DROP:
            data.pop(key, None)
        else:
            data[key] = value
    _write_manifest(folder, data)
    return folder


_DROP = object()


def _search(ctx: Context, *extra) -> list:
    return ["search", "--index", ctx.folder / "index", "--model", ctx.env["tiny"], "--query", "a query",
            *extra, *QUIET]


def _npy(array) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _vectors(ctx_env) -> "object":
    import numpy as np

    return np.load(_base_index(ctx_env) / "vectors.npy", allow_pickle=False)


class _Payload:
    """Pickled, it writes the canary when unpickled: proof that code ran from a file."""

    def __init__(self, canary: Path):
        self.canary = str(canary)

    def __reduce__(self):
        return (exec, (f"open({self.canary!r}, 'w').write('pickle from vectors.npy ran')",))


def _pickled_vectors(ctx: Context) -> bytes:
    import numpy as np

    array = np.empty((2,), dtype=object)
    array[0], array[1] = _Payload(ctx.canary), _Payload(ctx.canary)
    return _npy(array)


def _faiss_bytes(vectors, kind: str = "ip") -> bytes:
    import faiss
    import numpy as np

    index = faiss.IndexFlatIP(vectors.shape[1]) if kind == "ip" else faiss.IndexFlatL2(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return bytes(faiss.serialize_index(index))


def _hits_ok(ctx: Context, result) -> str | None:
    return None if result.rc == 0 else f"rc {result.rc}"


# ----------------------------------------------------------------------------- ids.npy and IVF cases
def _ids_npy_cases(env, refused) -> list[FileCase]:
    """ids.npy (format /2): an int64 array of increasing corpus line numbers."""
    import numpy as np

    ids = lambda ctx: np.load(_base_index(ctx.env) / "ids.npy")  # noqa: E731
    N = ("ids.npy",)
    refused("ids-npy-reversed", lambda ctx: _tamper(ctx, "ids.npy", _npy(ids(ctx)[::-1].copy())), N)
    refused("ids-npy-past-the-corpus", lambda ctx: _tamper(ctx, "ids.npy", _npy(ids(ctx) + 10**6)), N)
    refused("ids-npy-negative", lambda ctx: _tamper(ctx, "ids.npy", _npy(-1 - ids(ctx))), N)
    refused("ids-npy-one-short", lambda ctx: _tamper(ctx, "ids.npy", _npy(ids(ctx)[:-1])), N)
    refused("ids-npy-float", lambda ctx: _tamper(ctx, "ids.npy", _npy(ids(ctx).astype(np.float64))), N)
    refused("ids-npy-object-pickle-canary", lambda ctx: _tamper(ctx, "ids.npy", _pickled_vectors(ctx)), N)
    refused("ids-npy-truncated", lambda ctx: _tamper(ctx, "ids.npy", _npy(ids(ctx))[:-4]), N)
    refused("ids-npy-stale-checksum", lambda ctx: _tamper(ctx, "ids.npy", _npy(ids(ctx)[::-1].copy()),
                                                          rehash=False), N)

    def ids_npy_fifo(ctx):
        folder = _index(ctx)
        (folder / "ids.npy").unlink()
        os.mkfifo(folder / "ids.npy")

    refused("ids-npy-is-a-fifo", ids_npy_fifo, N, timeout=30)
    return []


def _ivf_cases(env, refused) -> list[FileCase]:
    """An approximate index's parts (ivf_centroids.npy, ivf_sq.npy, ivf_lists.npy) and its manifest entry."""
    import numpy as np

    ivf = lambda ctx, name: np.load(_base_ivf_index(ctx.env) / name)  # noqa: E731
    meta = lambda ctx: _manifest(_base_ivf_index(ctx.env))["ivf"]  # noqa: E731

    def tamper(name, make, rehash=True):
        return lambda ctx: _tamper(ctx, name, make(ctx), rehash=rehash, base=_base_ivf_index)

    C, S, L, M = ("ivf_centroids.npy",), ("ivf_sq.npy",), ("ivf_lists.npy",), ("manifest.json",)
    refused("ivf-lists-past-nlist", tamper(L[0], lambda ctx: _npy(ivf(ctx, L[0]) + meta(ctx)["nlist"])), L)
    refused("ivf-lists-negative", tamper(L[0], lambda ctx: _npy(ivf(ctx, L[0]) - 1 - meta(ctx)["nlist"])), L)
    refused("ivf-lists-int64", tamper(L[0], lambda ctx: _npy(ivf(ctx, L[0]).astype(np.int64))), L)
    refused("ivf-lists-one-short", tamper(L[0], lambda ctx: _npy(ivf(ctx, L[0])[:-1])), L)
    refused("ivf-centroids-nan", tamper(C[0], lambda ctx: _npy(ivf(ctx, C[0]) * np.float32(np.nan))), C)
    refused("ivf-centroids-wrong-nlist", tamper(C[0], lambda ctx: _npy(np.vstack([ivf(ctx, C[0])] * 2))), C)
    refused("ivf-centroids-wrong-dimension", tamper(C[0], lambda ctx: _npy(ivf(ctx, C[0])[:, :-1].copy())), C)
    refused("ivf-centroids-pickle-canary", tamper(C[0], _pickled_vectors), C)
    refused("ivf-centroids-garbage", tamper(C[0], lambda ctx: os.urandom(256)), C)
    refused("ivf-sq-wrong-size", tamper(S[0], lambda ctx: _npy(ivf(ctx, S[0])[:-1].copy())), S)
    refused("ivf-sq-infinite", tamper(S[0], lambda ctx: _npy(ivf(ctx, S[0]) + np.float32(np.inf))), S)
    refused("ivf-sq-stale-checksum", tamper(S[0], lambda ctx: _npy(ivf(ctx, S[0]) * 2), rehash=False), S)

    def checksum_dropped(ctx):
        folder = _index(ctx, base=_base_ivf_index)
        data = _manifest(folder)
        data["files"].pop("ivf_lists.npy")
        _write_manifest(folder, data)

    refused("ivf-checksum-dropped-from-manifest", checksum_dropped, L)
    edit = lambda **changes: lambda ctx: _edit_manifest(ctx, base=_base_ivf_index, **changes)  # noqa: E731
    refused("manifest-unknown-index-kind", edit(index_type="hnsw"), M)
    refused("manifest-ivf-wrong-nlist", lambda ctx: _edit_manifest(
        ctx, base=_base_ivf_index, ivf={**meta(ctx), "nlist": meta(ctx)["nlist"] + 1}), C)
    refused("manifest-ivf-nprobe-above-nlist", lambda ctx: _edit_manifest(
        ctx, base=_base_ivf_index, ivf={**meta(ctx), "nprobe": meta(ctx)["nlist"] + 1}), M)
    refused("manifest-ivf-metric-l2", lambda ctx: _edit_manifest(
        ctx, base=_base_ivf_index, ivf={**meta(ctx), "metric": "l2"}), M)
    refused("manifest-ivf-codes-unknown", lambda ctx: _edit_manifest(
        ctx, base=_base_ivf_index, ivf={**meta(ctx), "codes": "pq64"}), M)
    refused("manifest-ivf-extra-key", lambda ctx: _edit_manifest(
        ctx, base=_base_ivf_index, ivf={**meta(ctx), "file": "/etc/passwd"}), M)
    refused("manifest-ivf-missing", edit(ivf=None), M)
    refused("manifest-format-1", edit(format="mirrorbert-index/1"), M)
    refused("manifest-ivf-description-on-exact", lambda ctx: _edit_manifest(
        ctx, ivf={"nlist": 1, "nprobe": 1, "codes": "sq8", "metric": "inner_product", "seed": 0}), M)

    def other_centroids(ctx):  # finite, the right shape, rehashed: may find other rows, never wrong scores
        return _npy(-ivf(ctx, C[0]))

    def both_searches(ctx):
        """(ivf hits, exact-scan hits over every row) of the tampered folder, as JSON."""
        from mirrorbert.cli.app import main

        rows = str(_manifest(_base_ivf_index(ctx.env))["rows"])
        found = []
        for extra in (["--top-k", "3"], ["--faiss", "no", "--top-k", rows]):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                assert main([str(a) for a in _search(ctx, *extra)]) == 0
            found.append(json.loads(out.getvalue().splitlines()[0])["hits"])
        return {"ivf": found[0], "exact": found[1]}  # a dict: a list would be taken for a command line

    def exact_scores(ctx, result) -> str | None:
        ivf_hits, every_row = result.value["ivf"], result.value["exact"]
        exact = {h["id"]: h["score"] for h in every_row}
        wrong = [h for h in ivf_hits if exact.get(h["id"]) != h["score"]]
        return f"scores not exact: {wrong}" if wrong or not ivf_hits else None

    return [FileCase("read:index:ivf-centroids-other-values-still-exact-scores", "tampered index folder",
                     tamper(C[0], other_centroids), both_searches, expect=WORKS, check=exact_scores)]


# ----------------------------------------------------------------------------- index cases
def _index_cases(env) -> list[FileCase]:
    import numpy as np

    W = "tampered index folder"
    cases: list[FileCase] = []

    def refused(id_, setup, names, what=W, action=None, timeout=60.0):
        cases.append(FileCase(f"read:index:{id_}", what, setup, action or (lambda ctx: _search(ctx)),
                              names=names, timeout=timeout))

    def rows() -> int:
        return int(_manifest(_base_index(env))["rows"])

    vec = lambda ctx: _vectors(ctx.env)  # noqa: E731
    refused("vectors-one-row-short", lambda ctx: _tamper(ctx, "vectors.npy", _npy(vec(ctx)[:-1])),
            ("vectors.npy",))
    refused("vectors-wrong-dimension", lambda ctx: _tamper(ctx, "vectors.npy", _npy(vec(ctx)[:, :-3])),
            ("vectors.npy",))
    refused("vectors-float64", lambda ctx: _tamper(ctx, "vectors.npy", _npy(vec(ctx).astype(np.float64))),
            ("vectors.npy",))
    refused("vectors-int-dtype", lambda ctx: _tamper(ctx, "vectors.npy", _npy(vec(ctx).astype(np.int32))),
            ("vectors.npy",))
    refused("vectors-object-pickle-canary", lambda ctx: _tamper(ctx, "vectors.npy", _pickled_vectors(ctx)),
            ("vectors.npy",))
    refused("vectors-object-pickle-canary-stale-checksum",
            lambda ctx: _tamper(ctx, "vectors.npy", _pickled_vectors(ctx), rehash=False), ("vectors.npy",))
    refused("vectors-truncated", lambda ctx: _tamper(ctx, "vectors.npy", _npy(vec(ctx))[:-200]), ("vectors.npy",))
    refused("vectors-nan-row", lambda ctx: _tamper(ctx, "vectors.npy", _npy(np.where(
        np.arange(rows())[:, None] == 1, np.nan, vec(ctx)).astype(np.float32))), ("vectors.npy",))
    refused("vectors-inf-value", lambda ctx: _tamper(ctx, "vectors.npy", _npy(np.where(
        np.arange(rows())[:, None] == 0, np.inf, vec(ctx)).astype(np.float32))), ("vectors.npy",))
    refused("vectors-fortran-order", lambda ctx: _tamper(ctx, "vectors.npy", _npy(np.asfortranarray(vec(ctx)))),
            ("vectors.npy",))
    refused("vectors-not-npy", lambda ctx: _tamper(ctx, "vectors.npy", os.urandom(4096)), ("vectors.npy",))
    refused("vectors-header-lies-about-shape", lambda ctx: _tamper(ctx, "vectors.npy", _npy(vec(ctx)).replace(
        f"({rows()}, ".encode(), f"({rows() * 1000}, ".encode(), 1)), ("vectors.npy",))
    refused("vectors-stale-checksum", lambda ctx: _tamper(ctx, "vectors.npy", _npy(vec(ctx)[::-1].copy()),
                                                          rehash=False), ("vectors.npy",))

    def vectors_fifo(ctx):
        folder = _index(ctx)
        (folder / "vectors.npy").unlink()
        os.mkfifo(folder / "vectors.npy")

    refused("vectors-is-a-fifo", vectors_fifo, ("vectors.npy",), timeout=30)

    def vectors_dev_zero(ctx):
        folder = _index(ctx)
        (folder / "vectors.npy").unlink()
        os.symlink("/dev/zero", folder / "vectors.npy")

    refused("vectors-link-to-dev-zero", vectors_dev_zero, ("vectors.npy",), timeout=30)

    refused("texts-not-strings", lambda ctx: _tamper(ctx, "texts.jsonl", "[1]\n" * rows()), ("texts.jsonl",))
    refused("texts-one-short", lambda ctx: _tamper(ctx, "texts.jsonl", '"a"\n' * (rows() - 1)), ("texts.jsonl",))
    refused("texts-lone-surrogate", lambda ctx: _tamper(ctx, "texts.jsonl", '"\\ud800"\n' * rows()),
            ("texts.jsonl",))
    refused("texts-invalid-utf8", lambda ctx: _tamper(ctx, "texts.jsonl", b'"\xff\xfe"\n' * rows()),
            ("texts.jsonl",))

    refused("faiss-garbage", lambda ctx: _tamper(ctx, "faiss.index", os.urandom(512)), ("faiss.index",))
    refused("faiss-wrong-dimension", lambda ctx: _tamper(ctx, "faiss.index", _faiss_bytes(
        np.hstack([vec(ctx), vec(ctx)[:, :1]]))), ("faiss.index",))
    refused("faiss-wrong-count", lambda ctx: _tamper(ctx, "faiss.index", _faiss_bytes(vec(ctx)[:-2])),
            ("faiss.index",))
    refused("faiss-l2-not-inner-product", lambda ctx: _tamper(ctx, "faiss.index", _faiss_bytes(vec(ctx), "l2")),
            ("faiss.index",))
    refused("faiss-other-vectors-same-shape", lambda ctx: _tamper(ctx, "faiss.index", _faiss_bytes(
        vec(ctx)[::-1].copy())), ("faiss.index",))

    def faiss_checksum_dropped(ctx):
        folder = _tamper(ctx, "faiss.index", _faiss_bytes(vec(ctx)[::-1].copy()), rehash=False)
        data = _manifest(folder)
        data.get("files", {}).pop("faiss.index", None)
        _write_manifest(folder, data)

    refused("faiss-checksum-dropped-from-manifest", faiss_checksum_dropped, ("faiss.index",))
    refused("faiss-stale-checksum", lambda ctx: _tamper(ctx, "faiss.index", _faiss_bytes(vec(ctx)[::-1].copy()),
                                                        rehash=False), ("faiss.index",))

    M = ("manifest.json",)
    refused("manifest-rows-a-string", lambda ctx: _edit_manifest(ctx, rows=str(rows())), M)
    refused("manifest-dim-a-float", lambda ctx: _edit_manifest(ctx, dim=32.0), M)
    refused("manifest-dim-huge", lambda ctx: _edit_manifest(ctx, dim=10**12), M)
    refused("manifest-max-length-null", lambda ctx: _edit_manifest(ctx, max_length=None), M)
    refused("manifest-model-sha-missing", lambda ctx: _edit_manifest(ctx, model_sha256=_DROP), M)
    refused("manifest-corpus-sha-not-hex", lambda ctx: _edit_manifest(ctx, corpus_sha256="../" * 20), M)
    refused("manifest-files-names-another-file", lambda ctx: _edit_manifest(ctx, files={"../../x": "0" * 64}), M)
    refused("manifest-faiss-a-string", lambda ctx: _edit_manifest(ctx, faiss="yes"), M)
    refused("manifest-a-list", lambda ctx: (_index(ctx) / "manifest.json").write_text("[1, 2]"), M)
    refused("manifest-deep-nesting", lambda ctx: (_index(ctx) / "manifest.json").write_text(
        "[" * 100000 + "]" * 100000), M)
    refused("manifest-huge", lambda ctx: (_index(ctx) / "manifest.json").write_text(
        " " * (2 << 20) + json.dumps(_manifest(_base_index(ctx.env)))), M)
    refused("manifest-rows-more-than-corpus-lines", lambda ctx: _edit_manifest(ctx, rows=10**6), M)

    refused("corpus-is-dev-zero", lambda ctx: _edit_manifest(ctx, corpus="/dev/zero"), ("/dev/zero",), timeout=30)

    def corpus_fifo(ctx):
        fifo = ctx.folder / "corpus.fifo"
        os.mkfifo(fifo)
        _edit_manifest(ctx, corpus=str(fifo))

    refused("corpus-is-a-fifo", corpus_fifo, ("corpus.fifo",), timeout=30)

    def corpus_folder(ctx):
        (ctx.folder / "a-folder").mkdir()
        _edit_manifest(ctx, corpus=str(ctx.folder / "a-folder"))

    refused("corpus-is-a-folder", corpus_folder, ("a-folder",))

    def corpus_dangling(ctx):
        os.symlink(ctx.folder / "nowhere", ctx.folder / "dangling.txt")
        _edit_manifest(ctx, corpus=str(ctx.folder / "dangling.txt"))

    refused("corpus-dangling-link", corpus_dangling, ("dangling.txt",))

    def corpus_same_size_same_mtime(ctx):
        copy = ctx.folder / "corpus.txt"
        shutil.copy2(ctx.env["data"], copy)
        folder = _index(ctx)
        data = _manifest(folder)
        data["corpus"] = str(copy)
        _write_manifest(folder, data)
        st = copy.stat()
        text = copy.read_bytes()
        copy.write_bytes(text.replace(b"a", b"e", 1) if b"a" in text else b"x" + text[1:])
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))

    refused("corpus-edited-same-size-same-mtime", corpus_same_size_same_mtime, ("changed since",))

    def corpus_grew(ctx):
        copy = ctx.folder / "corpus.txt"
        shutil.copy2(ctx.env["data"], copy)
        folder = _index(ctx)
        _edit_manifest_folder(folder, corpus=str(copy))
        with open(copy, "ab") as fh:
            fh.write(b"x" * (1 << 20))

    refused("corpus-grew-refused-before-hashing", corpus_grew, ("changed since",))

    def corpus_fifo_given(ctx):
        _index(ctx)
        os.mkfifo(ctx.folder / "given.fifo")

    refused("corpus-option-is-a-fifo", corpus_fifo_given, ("given.fifo",),
            action=lambda ctx: _search(ctx, "--corpus", ctx.folder / "given.fifo"), timeout=30)

    def corpus_gone(ctx):
        copy = ctx.folder / "corpus.txt"
        shutil.copy2(ctx.env["data"], copy)
        _edit_manifest_folder(_index(ctx), corpus=str(copy))
        copy.unlink()

    cases.append(FileCase("read:index:corpus-gone-answers-from-stored-texts", W, corpus_gone,
                          lambda ctx: _search(ctx), expect=WORKS, check=_hits_ok))

    refused("manifest-without-checksums", lambda ctx: _edit_manifest(ctx, files=_DROP, corpus_bytes=_DROP),
            ("manifest.json",))
    cases.extend(_ids_npy_cases(env, refused))
    cases.extend(_ivf_cases(env, refused))

    # the Python API: SearchIndex.save/load folders (a folder without a manifest too) and query vectors
    def saved(ctx, vectors_bytes: bytes | None = None, texts: str | None = None):
        from mirrorbert.search.exact import SearchIndex

        folder = ctx.folder / "saved"
        SearchIndex.from_vectors(np.eye(4, 8, dtype=np.float32), ["a", "b", "c", "d"], use_faiss=False).save(folder)
        if vectors_bytes is not None:
            (folder / "vectors.npy").write_bytes(vectors_bytes)
        if texts is not None:
            (folder / "texts.jsonl").write_text(texts)

    def no_manifest(ctx):  # vectors, texts and an index.json, as a folder of a format never released
        folder = ctx.folder / "saved"
        folder.mkdir()
        (folder / "vectors.npy").write_bytes(_pickled_vectors(ctx))
        (folder / "texts.jsonl").write_text('"a"\n"b"\n"c"\n"d"\n')
        (folder / "index.json").write_text('{"format_version": 1}')

    def load_saved(ctx):
        from mirrorbert.search.exact import SearchIndex

        return SearchIndex.load(ctx.folder / "saved", use_faiss=False)

    cases.append(FileCase("read:index:api-load-pickled-vectors", "tampered saved search index",
                          lambda ctx: saved(ctx, _pickled_vectors(ctx)), load_saved, names=("vectors.npy",)))
    cases.append(FileCase("read:index:api-load-nan-vectors", "tampered saved search index",
                          lambda ctx: saved(ctx, _npy(np.full((4, 8), np.nan, np.float32))), load_saved,
                          names=("vectors.npy",)))
    cases.append(FileCase("read:index:api-load-texts-not-strings", "tampered saved search index",
                          lambda ctx: saved(ctx, texts="{}\n[]\n1\n2\n"), load_saved, names=("texts.jsonl",)))
    cases.append(FileCase("read:index:api-load-manifest-deeply-nested", "tampered saved search index",
                          lambda ctx: (saved(ctx), (ctx.folder / "saved" / "manifest.json").write_text(
                              "[" * 50000 + "]" * 50000)), load_saved, names=("manifest.json",)))
    cases.append(FileCase("read:index:api-load-folder-without-manifest", "tampered saved search index",
                          no_manifest, load_saved, names=("manifest.json",)))

    def nan_query(ctx):
        from mirrorbert.search.exact import SearchIndex

        index = SearchIndex.from_vectors(np.eye(4, 8, dtype=np.float32), ["a", "b", "c", "d"], use_faiss=True)
        return index.search_vectors(np.full((1, 8), np.nan), 2)

    cases.append(FileCase("read:index:api-nan-query-vector", "non-finite query", None, nan_query,
                          names=("queries",)))

    def wrong_dim_query(ctx):
        from mirrorbert.search.exact import SearchIndex

        index = SearchIndex.from_vectors(np.eye(4, 8, dtype=np.float32), ["a", "b", "c", "d"], use_faiss=False)
        return index.search_vectors([[1.0, 2.0, 3.0]], 2)

    cases.append(FileCase("read:index:api-query-of-another-dimension", "mismatched query", None, wrong_dim_query,
                          names=("queries",)))
    return cases


def _edit_manifest_folder(folder: Path, **changes) -> None:
    data = _manifest(folder)
    data.update(changes)
    _write_manifest(folder, data)


# ----------------------------------------------------------------------------- MLM token cache
def _tokenizer(env):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(env["tiny"]))


def _prepare(ctx: Context):
    from mirrorbert.data.token_stream import prepare_corpus

    return prepare_corpus(ctx.folder / "corpus.txt", _tokenizer(ctx.env), ctx.folder / "cache", eval_fraction=0.0,
                          show_progress=False)


def _expected_tokens(ctx: Context) -> list[int]:
    tok = _tokenizer(ctx.env)
    out: list[int] = []
    for line in (ctx.folder / "corpus.txt").read_text(encoding="utf-8").splitlines():
        if line.strip():
            ids = tok(line.strip(), add_special_tokens=False)["input_ids"]
            if ids:
                out += list(ids) + [tok.sep_token_id]
    return out


def _tokens_right(ctx: Context, result) -> str | None:
    try:
        got = [int(t) for t in result.value.stream("train")]
    except Exception as exc:  # noqa: BLE001  a damaged cache that was used: the case's finding, not a crash
        return f"the cache returned cannot be read: {type(exc).__name__}: {exc}"
    if got != _expected_tokens(ctx):
        return "the cache's tokens are not those of the corpus as it is now"
    return None


def _cache_root(ctx: Context) -> Path:
    return next(p for p in (ctx.folder / "cache").iterdir() if p.is_dir() and not p.name.startswith(".")
                and ".damaged-" not in p.name)


def _mlm_cases(env) -> list[FileCase]:
    W = "damaged or stale MLM token cache"
    cases: list[FileCase] = []

    def primed(damage=None):
        def setup(ctx):
            (ctx.folder / "corpus.txt").write_text("the first sentence here\nand a second one\n\nanother doc\n",
                                                   encoding="utf-8")
            _prepare(ctx)
            if damage is not None:
                damage(ctx, _cache_root(ctx))
        return setup

    def set_aside_and_right(ctx, result):
        problem = _tokens_right(ctx, result)
        if problem:
            return problem
        if not any(".damaged-" in p.name for p in (ctx.folder / "cache").iterdir()):
            return "the damaged cache was not set aside"
        return None if "damaged" in result.err else "no warning about the damaged cache"

    def works(id_, damage, check=set_aside_and_right):
        cases.append(FileCase(f"read:mlm-cache:{id_}", W, primed(damage), _prepare, expect=WORKS, check=check))

    def same_size_same_mtime(ctx, root):
        path = ctx.folder / "corpus.txt"
        st = path.stat()
        path.write_text("the final sentence here\nand a second one\n\nanother doc\n", encoding="utf-8")
        assert path.stat().st_size == st.st_size
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    works("stale-text-same-size-same-mtime", same_size_same_mtime, check=_tokens_right)

    def truncate(ctx, root):
        data = (root / "train.tokens").read_bytes()
        (root / "train.tokens").write_bytes(data[: len(data) // 2])

    works("train-tokens-truncated", truncate)

    def flip(ctx, root):
        data = bytearray((root / "train.tokens").read_bytes())
        data[0] ^= 1
        (root / "train.tokens").write_bytes(bytes(data))

    works("train-tokens-edited-same-size", flip)

    def meta_edit(**changes):
        def damage(ctx, root):
            meta = json.loads((root / "manifest.json").read_text())
            meta.update(changes)
            (root / "manifest.json").write_text(json.dumps(meta))
        return damage

    works("meta-wrong-dtype", meta_edit(dtype="float64"))
    works("meta-token-count-a-string", meta_edit(splits={"train": {"tokens": "12"}, "eval": {}}))
    works("meta-deeply-nested", lambda ctx, root: (root / "manifest.json").write_text("[" * 100000 + "]" * 100000))
    works("meta-not-json", lambda ctx, root: (root / "manifest.json").write_bytes(b"\x00\xff not json"))

    def ids_outside_vocab(ctx, root):
        import numpy as np

        meta = json.loads((root / "manifest.json").read_text())
        tokens = np.memmap(root / "train.tokens", dtype=meta["dtype"], mode="r+")
        tokens[0] = np.iinfo(tokens.dtype).max
        tokens.flush()
        del tokens
        meta.setdefault("files", {})["train.tokens"] = hashlib.sha256((root / "train.tokens").read_bytes()).hexdigest()
        (root / "manifest.json").write_text(json.dumps(meta))

    works("ids-outside-vocabulary-checksum-updated", ids_outside_vocab)

    def replaced_by_file(ctx, root):
        shutil.rmtree(root)
        root.write_text("not a cache folder\n")

    works("cache-folder-replaced-by-a-file", replaced_by_file)

    def fifo_corpus(ctx):
        os.mkfifo(ctx.folder / "corpus.txt")

    cases.append(FileCase("read:mlm-cache:corpus-is-a-fifo", "hostile MLM corpus", fifo_corpus, _prepare,
                          names=("corpus.txt",), timeout=30))
    return cases


# ----------------------------------------------------------------------------- data readers
def _data_cases(env) -> list[FileCase]:
    W = "crafted data file"
    cases: list[FileCase] = []
    tiny = env["tiny"]

    def file_case(id_, name, content, action, expect=REFUSED, names=(), check=None):
        def setup(ctx):
            if callable(content):
                content(ctx, ctx.folder / name)
            else:
                ctx.write(name, content)
        cases.append(FileCase(f"read:data:{id_}", W, setup, action, expect=expect, names=names or (name,),
                              check=check))

    def train(name, *extra):
        return lambda ctx: ["train", "--model", tiny, "--data", ctx.folder / name, "--output", ctx.folder / "out",
                            "--steps", "1", "--batch-size", "2", *extra, *QUIET]

    def encode(name, *extra):
        return lambda ctx: ["encode", "--model", tiny, "--input", ctx.folder / name, "--output",
                            ctx.folder / "vectors.npy", *extra, *QUIET]

    def search(name, *extra):
        return lambda ctx: ["search", "--model", tiny, "--corpus", ctx.folder / name, "--query", "q", *extra, *QUIET]

    def index(name, *extra):
        return lambda ctx: ["index", "--model", tiny, "--corpus", ctx.folder / name, "--output", ctx.folder / "idx",
                            *extra, *QUIET]

    unterminated = 'text,n\n"first row",1\n"second, never closed,2\nthird,3\nfourth,4\n'
    file_case("csv-unterminated-quote-train", "data.csv", unterminated, train("data.csv", "--column", "text"),
              names=("data.csv:3",))
    file_case("csv-unterminated-quote-encode", "data.csv", unterminated, encode("data.csv", "--column", "text"),
              names=("data.csv:3",))
    file_case("csv-unterminated-quote-search", "data.csv", unterminated, search("data.csv", "--column", "text"),
              names=("data.csv:3",))
    file_case("tsv-unterminated-quote-index", "data.tsv", unterminated.replace(",", "\t"),
              index("data.tsv", "--column", "text"), names=("data.tsv:3",))

    def rows_of(n):
        def check(ctx, result):
            import numpy as np

            vectors = np.load(ctx.folder / "vectors.npy", allow_pickle=False)
            return None if vectors.shape[0] == n else f"{vectors.shape[0]} rows, expected {n}"
        return check

    long_field = "text,n\n" + '"' + "word " * 40000 + '",1\nshort one,2\n'
    file_case("csv-field-over-131072-chars-encode", "long.csv", long_field, encode("long.csv", "--column", "text"),
              expect=WORKS, check=rows_of(2))

    def index_rows(n):
        def check(ctx, result):
            manifest = json.loads((ctx.folder / "idx" / "manifest.json").read_text())
            return None if manifest["rows"] == n else f"{manifest['rows']} rows, expected {n}"
        return check

    file_case("csv-field-over-131072-chars-index", "long.csv", long_field, index("long.csv", "--column", "text"),
              expect=WORKS, check=index_rows(2))
    file_case("csv-duplicate-column-search", "dup.csv", "text,text\na,b\nc,d\n", search("dup.csv", "--column", "text"),
              names=("dup.csv",))
    file_case("tsv-duplicate-column-train", "dup.tsv", "text\ttext\na\tb\nc\td\ne\tf\n",
              train("dup.tsv", "--column", "text"), names=("dup.tsv",))

    def table(kind):
        def make(ctx, path):
            import pyarrow as pa
            import pyarrow.parquet as pq

            t = pa.table([pa.array(["alpha", "beta", "gamma"]), pa.array(["x", "y", "z"])], names=["text", "text"])
            if kind == "parquet":
                pq.write_table(t, path)
            else:
                with pa.ipc.new_file(str(path), t.schema) as writer:
                    writer.write_table(t)
        return make

    file_case("parquet-duplicate-column-train", "dup.parquet", table("parquet"),
              train("dup.parquet", "--column", "text"))
    file_case("parquet-duplicate-column-encode", "dup.parquet", table("parquet"),
              encode("dup.parquet", "--column", "text"))
    file_case("arrow-duplicate-column-index", "dup.arrow", table("arrow"), index("dup.arrow", "--column", "text"))
    file_case("arrow-duplicate-column-search", "dup.arrow", table("arrow"), search("dup.arrow", "--column", "text"))

    zero = "a real sentence\nanother real sentence\n\u200b\u200b\n\x01\x02\x03\nthird real one\n"
    file_case("zero-token-lines-skipped-in-train", "zero.txt", zero, train("zero.txt"), expect=WORKS,
              check=lambda ctx, r: None if "give no tokens" in r.err else "no warning about strings without tokens")
    file_case("only-one-string-with-tokens", "zero1.txt", "one real sentence\n\u200b\n\u200c\u200d\n\x07\n",
              train("zero1.txt"), names=("zero1.txt",))
    file_case("jsonl-lone-surrogate-train", "s.jsonl", '{"t": "ok"}\n{"t": "\\ud800 lone"}\n{"t": "fine"}\n',
              train("s.jsonl", "--field", "t"), names=("s.jsonl:2",))
    file_case("jsonl-lone-surrogate-index", "s.jsonl", '{"t": "ok"}\n{"t": "x\\udfff"}\n',
              index("s.jsonl", "--field", "t"), names=("s.jsonl:2",))

    def queries_surrogate(ctx):
        ctx.write("q.jsonl", '{"t": "\\ud83d"}\n')
        ctx.write("c.jsonl", '{"t": "one"}\n{"t": "two"}\n')

    cases.append(FileCase("read:data:jsonl-lone-surrogate-queries", W, queries_surrogate,
                          lambda ctx: ["search", "--model", tiny, "--corpus", ctx.folder / "c.jsonl", "--queries",
                                       ctx.folder / "q.jsonl", "--field", "t", *QUIET], names=("q.jsonl:1",)))
    file_case("jsonl-invalid-utf8-encode", "bad.jsonl", b'{"t": "ok"}\n{"t": "\xff\xfe"}\n',
              encode("bad.jsonl", "--field", "t"), names=("bad.jsonl:2",))
    file_case("jsonl-deep-nesting-line", "deep.jsonl", '{"t": "ok"}\n' + "[" * 100000 + "]" * 100000 + "\n",
              encode("deep.jsonl", "--field", "t"), names=("deep.jsonl:2",))
    file_case("nul-bytes-in-text-encode", "nul.txt", b"a line\nwith a \x00 NUL\nlast\n", encode("nul.txt"),
              expect=WORKS, check=rows_of(3))
    file_case("csv-nul-byte-encode", "nul.csv", b"text\nx\x00y\nplain\n", encode("nul.csv", "--column", "text"),
              expect=WORKS, check=rows_of(2))
    file_case("csv-bom-crlf-header-encode", "bom.csv", "\ufefftext,n\r\nalpha,1\r\nbeta,2\r\n".encode("utf-8"),
              encode("bom.csv", "--column", "text"), expect=WORKS, check=rows_of(2))
    return cases


# ----------------------------------------------------------------------------- evaluation gold files
def _eval_cases(env) -> list[FileCase]:
    W = "crafted evaluation gold file"
    cases: list[FileCase] = []
    tiny = env["tiny"]

    def case(id_, files: dict[str, str], task: str, names: tuple[str, ...], extra=()):
        def setup(ctx):
            for rel, content in files.items():
                ctx.write(f"data/{rel}", content)

        cases.append(FileCase(f"read:eval:{id_}", W, setup,
                              lambda ctx: ["eval", "--model", tiny, "--tasks", task, "--data-dir",
                                           ctx.folder / "data", *extra, "--no-progress"],
                              names=names))

    def stsb(score):
        return "\n".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{score if i == 2 else '2.5'}\t"
                         f"a sentence {i}\tanother sentence {i}" for i in range(1, 6)) + "\n"

    case("stsb-gold-nan", {"sts/STSBenchmark/sts-test.csv": stsb("nan")}, "sts", ("sts-test.csv:2",))
    case("stsb-gold-inf", {"sts/STSBenchmark/sts-test.csv": stsb("inf")}, "sts", ("sts-test.csv:2",))
    case("stsb-dev-gold-minus-7", {"sts/STSBenchmark/sts-test.csv": stsb("1.0"),
                                   "sts/STSBenchmark/sts-dev.csv": stsb("-7")}, "sts", ("sts-dev.csv:2",))
    pairs = "".join(f"sentence a {i}\tsentence b {i}\n" for i in range(5))
    case("sts12-gold-minus-7", {"sts/STS12-en-test/STS.input.MSRvid.txt": pairs,
                                "sts/STS12-en-test/STS.gs.MSRvid.txt": "1\n2\n-7\n3\n4\n"}, "sts",
         ("STS.gs.MSRvid.txt:3",))
    case("sts16-gold-text", {"sts/STS16-en-test/STS.input.headlines.txt": pairs,
                             "sts/STS16-en-test/STS.gs.headlines.txt": "1\nhigh\n2\n3\n4\n"}, "sts",
         ("STS.gs.headlines.txt:2",))
    case("sts-es-gold-6", {"sts/STS17/STS.input.track3.es-es.txt": pairs,
                           "sts/STS17/STS.gs.track3.es-es.txt": "1\n2\n3\n6\n4\n"}, "sts",
         ("STS.gs.track3.es-es.txt:4",), extra=("--sts-sets", "sts-es"))
    sick = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n" + "".join(
        f"{i}\tsentence a {i}\tsentence b {i}\t{'NaN' if i == 3 else '3.5'}\tNEUTRAL\n" for i in range(1, 6))
    case("sick-gold-nan", {"sts/SICK/SICK_test_annotated.txt": sick}, "sts", ("SICK_test_annotated.txt:4",))
    simlex = "word1\tword2\tPOS\tSimLex999\n" + "".join(
        f"w{i}\tv{i}\tN\t{'11' if i == 2 else '5'}\n" for i in range(1, 6))
    case("simlex-gold-out-of-range", {"wordsim/SimLex-999.txt": simlex}, "wordsim", ("SimLex-999.txt:3",))
    case("men-gold-nan", {"wordsim/EN-MEN-TR-3k.txt": "sun sunlight 50\nbird nan nan\ncar auto 40\n"}, "wordsim",
         ("EN-MEN-TR-3k.txt:2",))
    case("ws353-gold-negative", {"wordsim/EN-WS-353-ALL.txt": "tiger\tcat\t7.35\nbook\tpaper\t-7\n"}, "wordsim",
         ("EN-WS-353-ALL.txt:2",))
    case("multisimlex-gold-inf", {"wordsim/multisimlex.tsv": "ID\tENGLISH_1\tENGLISH_2\tENGLISH_score\n"
                                                              "1\told\tnew\t1.5\n2\tsmart\tclever\tinf\n"},
         "wordsim", ("multisimlex.tsv:3",))

    def api(ctx):
        ctx.write("data/sts/STSBenchmark/sts-test.csv", stsb("nan"))
        from mirrorbert.evaluation.runner import evaluate

        return evaluate(str(ctx.env["tiny"]), tasks="sts", data_dir=ctx.folder / "data")

    cases.append(FileCase("read:eval:api-evaluate-stsb-gold-nan", W, None, api, names=("sts-test.csv:2",)))
    return cases


# ----------------------------------------------------------------------------- configs and seeds
def _config_cases(env) -> list[FileCase]:
    W = "model config with absurd sizes"
    cases: list[FileCase] = []
    tiny = env["tiny"]

    def config_case(id_, changes, action, names=("config.json",)):
        def setup(ctx):
            folder = ctx.copy_model()
            config = json.loads((folder / "config.json").read_text())
            config.update(changes)
            (folder / "config.json").write_text(json.dumps(config))
            ctx.write("q.txt", "one\ntwo\nthree\n")

        cases.append(FileCase(f"read:config:{id_}", W, setup, action, names=names, timeout=60))

    model = lambda ctx: ctx.folder / "model"  # noqa: E731
    config_case("300000-layers-search", {"num_hidden_layers": 300000},
                lambda ctx: ["search", "--model", model(ctx), "--corpus", ctx.folder / "q.txt", "--query", "x", *QUIET])
    config_case("hidden-size-1e9-encode", {"hidden_size": 10**9},
                lambda ctx: ["encode", "--model", model(ctx), "--input", ctx.folder / "q.txt", "--output",
                             ctx.folder / "v.npy", *QUIET])
    config_case("vocab-1e12-train", {"vocab_size": 10**12},
                lambda ctx: ["train", "--model", model(ctx), "--data", ctx.folder / "q.txt", "--output",
                             ctx.folder / "out", "--steps", "1", "--batch-size", "2", *QUIET])
    config_case("max-positions-huge-index", {"max_position_embeddings": 10**10},
                lambda ctx: ["index", "--model", model(ctx), "--corpus", ctx.folder / "q.txt", "--output",
                             ctx.folder / "idx", *QUIET])
    config_case("3-layers-weights-hold-2-pretrain-mlm", {"num_hidden_layers": 3},
                lambda ctx: ["pretrain-mlm", "--model", model(ctx), "--corpus", ctx.folder / "q.txt", "--output",
                             ctx.folder / "out", "--stop-after-steps", "1", *QUIET], names=("config.json", "layers"))
    config_case("negative-layers-encode", {"num_hidden_layers": -1},
                lambda ctx: ["encode", "--model", model(ctx), "--input", ctx.folder / "q.txt", "--output",
                             ctx.folder / "v.npy", *QUIET], names=("config.json", "num_hidden_layers"))
    config_case("300000-layers-api-load", {"num_hidden_layers": 300000},
                lambda ctx: __import__("mirrorbert").Encoder.load(str(model(ctx))))

    S = "20-digit seed"
    big = "99999999999999999999"

    def seed_case(id_, action):
        cases.append(FileCase(f"read:seed:{id_}", S, lambda ctx: ctx.write("q.txt", "one\ntwo\nthree\n"), action,
                              names=("--seed",)))

    seed_case("train", lambda ctx: ["train", "--model", tiny, "--data", ctx.folder / "q.txt", "--output",
                                    ctx.folder / "out", "--seed", big, *QUIET])
    seed_case("train-2-pow-32", lambda ctx: ["train", "--model", tiny, "--data", ctx.folder / "q.txt", "--output",
                                             ctx.folder / "out", "--seed", str(2**32), *QUIET])
    seed_case("pretrain-mlm", lambda ctx: ["pretrain-mlm", "--model", tiny, "--corpus", ctx.folder / "q.txt",
                                           "--output", ctx.folder / "out", "--seed", big, *QUIET])
    seed_case("gloss-pretrain", lambda ctx: ["gloss-pretrain", "--model", tiny, "--output", ctx.folder / "out",
                                             "--seed", big, *QUIET])
    seed_case("finetune-sts-seeds", lambda ctx: ["finetune-sts", "--model", tiny, "--output", ctx.folder / "out",
                                                 "--seeds", f"0,{big}", *QUIET])

    def config_file_seed(ctx):
        ctx.write("q.txt", "one\ntwo\nthree\n")
        ctx.write("cfg.json", json.dumps({"seed": 10**20}))

    cases.append(FileCase("read:seed:train-config-file", S, config_file_seed,
                          lambda ctx: ["train", "--config", ctx.folder / "cfg.json", "--model", tiny, "--data",
                                       ctx.folder / "q.txt", "--output", ctx.folder / "out", *QUIET],
                          names=("seed",)))
    return cases


# ----------------------------------------------------------------------------- Python inputs
def _api_cases(env) -> list[FileCase]:
    W = "mismatched Python inputs"
    cases: list[FileCase] = []

    def encoder(ctx):
        from mirrorbert import Encoder

        return Encoder.load(str(ctx.env["tiny"]))

    def refused(id_, call, names):
        cases.append(FileCase(f"read:api:{id_}", W, None, call, names=names))

    import numpy as np

    refused("similarity-numbers-as-b", lambda ctx: encoder(ctx).similarity(["a", "b"], [1, 2]), ("b",))
    refused("similarity-empty-a", lambda ctx: encoder(ctx).similarity([], ["a"]), ("a:",))
    refused("similarity-mixed-list", lambda ctx: encoder(ctx).similarity(["a", 3], ["b"]), ("a:",))
    refused("similarity-vectors-of-another-dimension",
            lambda ctx: encoder(ctx).similarity(np.zeros((2, 7)), ["a"]), ("a:",))
    refused("similarity-nan-vectors", lambda ctx: encoder(ctx).similarity(["a"], np.full((1, 32), np.nan)), ("b:",))
    refused("similarity-dict", lambda ctx: encoder(ctx).similarity({"x": 1}, ["a"]), ("a:",))
    refused("search-corpus-of-numbers", lambda ctx: _api_search(encoder(ctx), ["x"], [1, 2, 3]), ("corpus",))
    refused("search-queries-of-bytes", lambda ctx: _api_search(encoder(ctx), [b"x"], ["a", "b"]), ("queries",))
    refused("encode-list-of-bytes", lambda ctx: encoder(ctx).encode([b"bytes"]), ("texts",))

    def similarity_works(ctx):
        return encoder(ctx).similarity(["a", "b"], "c")

    cases.append(FileCase("read:api:similarity-str-and-list-works", W, None, similarity_works, expect=WORKS,
                          check=lambda ctx, r: None if r.value.shape == (2, 1) and np.isfinite(r.value).all()
                          else f"shape {r.value.shape}"))

    def glove_pickle(ctx):
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = ctx.folder / "glove"
        folder.mkdir()
        pq.write_table(pa.table({"word": ["a", "b"]}), folder / "glove_6B_index.parquet")
        (folder / "glove_6B_50d_emb.npy").write_bytes(_pickled_vectors(ctx))

    cases.append(FileCase("read:api:glove-vectors-pickled", "pickled .npy", glove_pickle,
                          lambda ctx: ["eval", "--model", f"glove:{ctx.folder / 'glove'}", "--tasks", "wordsim",
                                       "--data-dir", ctx.env.get("shared", ctx.folder), "--no-progress"],
                          names=("glove_6B_50d_emb.npy",)))
    return cases


def cases(env) -> list[FileCase]:
    return [*_index_cases(env), *_mlm_cases(env), *_data_cases(env), *_eval_cases(env), *_config_cases(env),
            *_api_cases(env)]


def _api_search(encoder, queries, corpus):
    from mirrorbert.search.exact import search

    return search(encoder, queries, corpus)
