"""A search index on disk: encode a corpus once, answer `search --index` from it afterwards.

The folder holds the L2-normalised vectors (`vectors.npy`), the texts (`texts.jsonl`), each row's id in the
corpus file (`ids.json`: the line or record number, as `search --corpus` reports it), a faiss index when faiss
is installed (`faiss.index`, an exact IndexFlatIP), and `manifest.json`: the model's fingerprint (SHA-256 of
its config, tokenizer and weight files), the pooling and maximum length used, and the corpus's path, SHA-256
and line count. Answers are refused, in one line, when the model or the corpus has changed since: hits from
another model's vectors, or ids pointing into an edited file, would be silently wrong.

Read back as untrusted (a folder may come from someone else): every file of the folder is read through
`safeguards.confined.ConfinedFolder` (inside the folder, a regular file, of bounded size: a link leading out
or a FIFO is refused before any read); every field of the manifest is type-checked; each file's SHA-256
recorded in the manifest (`files`) is matched before the file is parsed; the .npy header is read without
pickles and its dtype and shape must be the manifest's; vectors must be finite and of unit length;
`ids.json` must be a flat list of the expected length of increasing line numbers (its size is bounded
before parsing); `faiss.index` must hold `rows` vectors of `dim` dimensions; the corpus named in the
manifest must be a regular file of the recorded size before it is hashed (never a device or a FIFO).
Any mismatch is one `UserError` naming the file. An index written before checksums were recorded is
still checked for structure, with a warning.

Checked against what it claims: a manifest is the folder's own word, and a rehashed folder agrees with it.
So with `--corpus` the texts and ids are verified against the corpus's records (`load_index(corpus=...)`:
a hit's text is then the corpus's), and the settings that change results (pooling, maximum length,
normalisation) are checked against the loaded model by re-encoding a few stored texts
(`check_vectors_match_model`): a manifest edited to another pooling no longer matches its vectors.

Why not only `SearchIndex.save`: that keeps the vectors for Python users; this adds the identity checks a
command line needs (a folder outlives the shell session that knew which model built it).
"""

from __future__ import annotations

import collections.abc
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import mirrorbert.jsonio as jsonio
from mirrorbert.data.readers import MAX_LINE_BYTES, UNSAFE_CHARS, shown
from mirrorbert.errors import UserError
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.preflight import looks_like_path
from mirrorbert.safeguards.readback import PositionedReader, file_sha256, open_regular, parse_json, stream_sha256
from mirrorbert.search.index_files import IVF_FILES, open_member, open_vectors, read_ids_npy, read_ivf_parts
from mirrorbert.search.index_files import damaged as _damaged
from mirrorbert.settings.choices import POOLINGS

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "mirrorbert-index/2"  # /2: ids.npy instead of ids.json, the index kind and an IVF index's parts
FORMATS_READ = ("mirrorbert-index/1", FORMAT)
# Files whose bytes decide what a model computes; the rest (README, mirrorbert.json, training logs) do not.
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
IGNORED_MODEL_FILES = {"README.md", "mirrorbert.json", "manifest.json", ".mirrorbert-output"}
INDEX_FILES = ("vectors.npy", "texts.jsonl", "ids.json", "ids.npy", "faiss.index", *IVF_FILES)
IVF_KEYS = {"nlist", "nprobe", "codes", "metric", "seed"}
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes; a bigger one is not ours
MAX_TEXT_LINE = 6 * MAX_LINE_BYTES + 3  # a line of texts.jsonl: a corpus line, every byte a \u escape at worst
MAX_DEPTH = 32  # folders inside a model or dataset folder walked for its fingerprint
SPOT_ROWS = 8  # stored texts re-encoded to check the vectors against the loaded model
SPOT_MIN_COSINE = 0.999  # the same model and settings agree to 1e-6 on any device; other settings do not
SPOT_MAX_BYTES = 1 << 20  # a stored text longer than this is not re-encoded (tokenising it all takes seconds)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def regular_files(folder: ConfinedFolder, sub: str = "", depth: int = 0):
    """(relative name, resolved path) of every regular file under a confined folder, in the order of
    `sorted(Path.rglob)` (by path parts): links to files are followed only inside the folder, links to folders
    are not walked (as rglob does not), and a FIFO, device or socket is refused, never skipped."""
    import stat

    if depth > MAX_DEPTH:
        raise folder.refuse(sub, f"folders nested more than {MAX_DEPTH} deep")
    found = []
    for name, st in folder.entries(sub or "."):
        rel = f"{sub}/{name}" if sub else name
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            try:
                mode = os.stat(folder.resolve(rel)).st_mode  # a link leading out is refused here
            except FileNotFoundError:  # a dangling link: nothing to read (rglob's is_file() skipped it too)
                continue
            if stat.S_ISDIR(mode):
                continue
        if stat.S_ISDIR(mode):
            found.extend(regular_files(folder, rel, depth + 1))
        elif stat.S_ISREG(mode):
            found.append((rel, folder.resolve(rel)))
        else:
            from mirrorbert.safeguards.confined import describe_kind

            raise folder.refuse(shown(rel), f"is {describe_kind(mode)}, expected a regular file")
    return sorted(found, key=lambda item: tuple(item[0].split("/"))) if depth == 0 else found


def _member_sha256(folder: ConfinedFolder, rel: str) -> str:
    with open_member(folder, rel, None) as fh:
        return stream_sha256(fh)


def _is_corpus_folder(path: Path) -> bool:
    from mirrorbert.data.hf_datasets import is_dataset_folder

    return os.path.isdir(path) and is_dataset_folder(path)


def corpus_size(path: Path, option: str = "--corpus") -> int:
    """Bytes of a corpus file, or of a dataset folder's regular files together (each checked as it is read)."""
    path = Path(path)
    if _is_corpus_folder(path):
        folder = ConfinedFolder(path, option, "dataset folder")
        return sum(os.stat(real).st_size for _, real in regular_files(folder))
    with os.fdopen(open_regular(path, option), "rb") as fh:
        return os.fstat(fh.fileno()).st_size


def corpus_sha256(path: Path, option: str = "--corpus") -> str:
    """SHA-256 of a corpus file; of a dataset folder, over its regular files' names and checksums (the digest
    `safeguards.readback.file_sha256` gives a folder, but every member read through the confined reader)."""
    path = Path(path)
    if not _is_corpus_folder(path):
        return file_sha256(path, what=option)
    folder = ConfinedFolder(path, option, "dataset folder")
    digest = hashlib.sha256()
    for rel, _ in regular_files(folder):
        digest.update(rel.encode("utf-8") + b"\0" + _member_sha256(folder, rel).encode("ascii") + b"\n")
    return digest.hexdigest()


def model_fingerprint(model: str) -> str:
    """SHA-256 over the model folder's weight, config and tokenizer files (names and bytes), or `hub:<id>` for
    a hub id (its local files are not ours to hash; the id names the model). The folder is walked through the
    confined reader: a link leading out of it or a FIFO is refused, not hashed or waited on."""
    if not Path(model).is_dir():
        return f"hub:{model}"
    folder = ConfinedFolder(model, "--model", "model folder")
    digest = hashlib.sha256()
    for rel, _ in regular_files(folder):
        name = rel.rpartition("/")[2]
        if name in IGNORED_MODEL_FILES or Path(name).suffix not in MODEL_FILE_SUFFIXES or rel.startswith("."):
            continue
        digest.update(rel.encode("utf-8") + b"\0" + _member_sha256(folder, rel).encode("ascii") + b"\n")
    return digest.hexdigest()


def count_lines(path: Path, option: str = "--corpus") -> int:
    """Lines as every reader counts them (LF, CRLF or CR), whatever their encoding; rows of tabular data. The
    file is opened as every data file is (`readers.open_input`) and read a bounded line at a time."""
    from mirrorbert.data.readers import bounded_lines, open_input, split_lines
    from mirrorbert.data.hf_datasets import count_rows, is_table

    if is_table(Path(path)):
        return count_rows(path, option)
    with open_input(Path(path), option) as fh:
        return sum(len(split_lines(raw)) for raw in bounded_lines(fh, Path(path)))


@dataclass
class Manifest:
    model: str
    model_sha256: str
    pooling: str
    max_length: int
    corpus: str
    corpus_sha256: str
    corpus_lines: int
    rows: int
    dim: int
    column: str | None = None
    field: str | None = None
    faiss: bool = False
    format: str = FORMAT
    corpus_bytes: int | None = None  # size of the corpus when built: checked before hashing it
    files: dict[str, str] | None = None  # SHA-256 of each index file (None: written before checksums)
    index_type: str = "exact"  # exact | ivf (search/approximate.py)
    ivf: dict | None = None  # an IVF index's nlist, nprobe, codes, metric and seed
    normalized: bool = True  # the vectors are L2-normalised (search ranks by inner product); never False

    @property
    def ids_file(self) -> str:
        return "ids.json" if self.format == FORMATS_READ[0] else "ids.npy"

    @classmethod
    def read(cls, folder: Path, option: str = "--index") -> "Manifest":
        path = Path(folder) / MANIFEST
        if not os.path.exists(folder):
            raise UserError(f"{option} {folder}: no such folder (build one with `mirrorbert index`)")
        confined = ConfinedFolder(folder, option, "index folder")  # a file or FIFO there: refused, named
        if not confined.exists(MANIFEST):
            raise UserError(f"{option} {folder}: not a mirrorbert index (no {MANIFEST}; build one with `mirrorbert index`)")
        data = confined.read_json(MANIFEST, expect=dict, limit=MAX_MANIFEST_BYTES)
        if data.get("format") not in FORMATS_READ:
            raise UserError(f"{option} {path}: damaged (format {str(data.get('format'))[:40]!r}, expected one of "
                            f"{', '.join(map(repr, FORMATS_READ))})")
        problem = _manifest_problem(data)
        if problem:
            raise UserError(f"{option} {path}: damaged ({problem}); rebuild the index with `mirrorbert index`")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _is_int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


_OPTIONAL_STR = (str, type(None))
_FIELDS: dict[str, tuple[Any, bool]] = {  # name: (check, required)
    "model": (lambda v: _plain_str(v), True),
    "model_sha256": (lambda v: isinstance(v, str) and bool(v), True),
    "pooling": (lambda v: v in POOLINGS, True),
    "max_length": (lambda v: _is_int(v, 1), True),
    "corpus": (lambda v: _plain_str(v), True),
    "corpus_sha256": (lambda v: isinstance(v, str) and bool(_HEX64.match(v)), True),
    "corpus_lines": (lambda v: _is_int(v, 1), True),
    "rows": (lambda v: _is_int(v, 1), True),
    "dim": (lambda v: _is_int(v, 1) and v <= 1 << 16, True),
    "column": (lambda v: isinstance(v, _OPTIONAL_STR), False),
    "field": (lambda v: isinstance(v, _OPTIONAL_STR), False),
    "faiss": (lambda v: isinstance(v, bool), False),
    "corpus_bytes": (lambda v: v is None or _is_int(v, 0), False),
    "files": (lambda v: v is None or (isinstance(v, dict) and set(v) <= set(INDEX_FILES)
                                      and all(isinstance(h, str) and _HEX64.match(h) for h in v.values())), False),
    "index_type": (lambda v: v in ("exact", "ivf"), False),
    "ivf": (lambda v: v is None or _ivf_ok(v), False),
    "normalized": (lambda v: v is True, False),
}


def _plain_str(value: Any) -> bool:
    """A non-empty string a message may print: no control character (a terminal would act on it) and no NUL."""
    return isinstance(value, str) and bool(value) and not UNSAFE_CHARS.search(value)


def _ivf_ok(value: Any) -> bool:
    """An IVF description: exactly IVF_KEYS; 1 <= nprobe <= nlist; 8-bit codes on inner product."""
    return (isinstance(value, dict) and set(value) == IVF_KEYS and _is_int(value["nlist"], 1)
            and _is_int(value["nprobe"], 1) and value["nprobe"] <= value["nlist"] and _is_int(value["seed"])
            and value["codes"] == "sq8" and value["metric"] == "inner_product")


def _manifest_problem(data: dict) -> str | None:
    """The first field of a manifest that is missing or of the wrong type or range, as a phrase."""
    for name, (check, required) in _FIELDS.items():
        if name not in data:
            if required:
                return f"no field {name!r}"
            continue
        if not check(data[name]):
            return f"field {name!r} has a wrong type or value ({str(data[name])[:40]!r})"
    if data["rows"] > data["corpus_lines"]:
        return f"{data['rows']} rows but the corpus has {data['corpus_lines']} lines"
    kind, ivf = data.get("index_type", "exact"), data.get("ivf")
    if kind == "ivf" and (ivf is None or data["format"] != FORMAT):
        return f"index_type 'ivf' needs an 'ivf' description and format {FORMAT!r}"
    if kind == "exact" and ivf is not None:
        return "an 'ivf' description for an exact index"
    if ivf is not None and ivf["nlist"] > data["rows"]:
        return f"nlist {ivf['nlist']} is more than the {data['rows']} rows"
    return None


def write_index(folder: Path, texts: Sequence[str], ids: Sequence[int], manifest: Manifest, vectors=None,
                nprobe: int | None = None) -> None:
    """Everything into `folder` (a temporary folder of the write policy, renamed into place by the caller);
    the manifest records each file's SHA-256, checked before the file is read back.

    `vectors` is saved when given; without it `folder/vectors.npy` is already there (encoded straight to disk,
    encoder/streaming.py) and is only memory-mapped: texts are written one at a time, ids as one int64 array,
    and the IVF index trains on a sample and assigns rows a chunk at a time, so nothing here holds all the
    vectors in memory (an exact index's faiss.index does: exact is for corpora below the auto threshold)."""
    import numpy as np

    from mirrorbert.search.exact import build_faiss_index, faiss_available

    if vectors is not None:
        np.save(folder / "vectors.npy", np.ascontiguousarray(vectors, dtype=np.float32), allow_pickle=False)
    vectors = np.lib.format.open_memmap(folder / "vectors.npy", mode="r")  # ours, just written
    with open(folder / "texts.jsonl", "w", encoding="utf-8") as fh:
        for text in texts:
            fh.write(jsonio.dumps(text, ensure_ascii=False) + "\n")
    np.save(folder / "ids.npy", np.asarray(ids, dtype=np.int64), allow_pickle=False)
    manifest.format = FORMAT
    if manifest.index_type == "ivf":
        _write_ivf(folder, vectors, manifest, nprobe)
    elif faiss_available():
        import faiss

        faiss.write_index(build_faiss_index(vectors), str(folder / "faiss.index"))
        manifest.faiss = True
    del vectors
    manifest.files = {name: file_sha256(folder / name, what="--output") for name in INDEX_FILES
                      if (folder / name).is_file()}
    (folder / MANIFEST).write_text(jsonio.dumps(manifest.__dict__, indent=2) + "\n", encoding="utf-8")


def _write_ivf(folder: Path, vectors, manifest: Manifest, nprobe: int | None, seed: int = 0) -> None:
    """The IVF parts (centroids, quantiser ranges, list numbers) as .npy files; the faiss index itself is
    rebuilt from them at load (search/approximate.py says why no faiss file is stored)."""
    import numpy as np

    from mirrorbert.search.approximate import CODES, train_ivf

    parts = train_ivf(vectors, nprobe=nprobe, seed=seed)
    np.save(folder / IVF_FILES[0], parts.centroids.astype("<f4"), allow_pickle=False)
    np.save(folder / IVF_FILES[1], parts.sq_trained.astype("<f4"), allow_pickle=False)
    np.save(folder / IVF_FILES[2], parts.lists.astype("<i4"), allow_pickle=False)
    manifest.ivf = {"nlist": parts.nlist, "nprobe": parts.nprobe, "codes": CODES, "metric": "inner_product",
                    "seed": seed}


def check_index(folder: Path, model: str | None, corpus: str | None = None, option: str = "--index") -> Manifest:
    """The manifest, after checking that `model` (--model; None: the model the manifest names) is the model that
    built the index and the corpus file is unchanged (the one given, or the one the manifest names when it is
    still there). Before any weight loads.

    The corpus is hashed only when it is a regular file (or a dataset folder) of the size the manifest
    recorded: a manifest naming /dev/zero, a FIFO or a huge file is refused at once, not read forever."""
    manifest = Manifest.read(folder, option)
    if model is None:
        _check_named_model(manifest, folder, option)
    elif model_fingerprint(model) != manifest.model_sha256:
        raise UserError(f"{option} {folder}: built by another model ({shown(manifest.model)}); --model {model} "
                        "differs (its files' SHA-256 do not match): rebuild the index with `mirrorbert index`")
    path = Path(corpus) if corpus is not None else Path(manifest.corpus)
    what = "--corpus" if corpus is not None else f"{option} {folder}: {MANIFEST} names the corpus"
    if corpus is None and not os.path.lexists(path):
        logger.warning("%s: the corpus %s is gone; answering from the texts stored in the index", folder,
                       shown(manifest.corpus))
        return manifest
    if not os.path.lexists(path):
        raise UserError(f"--corpus {path}: no such file")
    if not _is_corpus_folder(path):
        os.close(open_regular(path, what))  # a device, FIFO, folder, dangling link: one line, no read
    if manifest.corpus_bytes is not None and corpus_size(path, what) != manifest.corpus_bytes:
        raise UserError(f"{option} {folder}: the corpus {path} changed since the index was built "
                        f"({corpus_size(path, what)} bytes, {manifest.corpus_bytes} when built): rebuild it with "
                        "`mirrorbert index`")
    if corpus_sha256(path, what) != manifest.corpus_sha256:
        raise UserError(f"{option} {folder}: the corpus {path} changed since the index was built "
                        f"(SHA-256 differs; the index has {manifest.corpus_lines} lines): rebuild it with "
                        "`mirrorbert index`")
    return manifest


def _check_named_model(manifest: Manifest, folder: Path, option: str) -> None:
    """The model the manifest names, for a search without --model: a folder whose files have the recorded
    fingerprint, or a Hub id (a name no folder here has). Anything else that exists there (a file, /dev/zero,
    a FIFO) is refused unopened: the manifest names its fingerprint too, so only a folder's own files check it."""
    named, where = manifest.model, f"{option} {folder}: {MANIFEST} names the model {shown(manifest.model)}"
    if os.path.lexists(named) and not os.path.isdir(named):
        raise UserError(f"{where}, which is not a folder: give the model with --model")
    if not os.path.lexists(named) and looks_like_path(named):
        raise UserError(f"{where}, which is not here (no such folder): give the model with --model")
    if model_fingerprint(named) != manifest.model_sha256:
        raise UserError(f"{option} {folder}: the model it names ({shown(named)}) changed since the index was built "
                        "(its files' SHA-256 do not match): rebuild the index with `mirrorbert index`")


def check_settings(manifest: Manifest, folder: Path, pooling: str | None, max_length: int | None) -> None:
    """--pooling/--max-length given with an index must be the manifest's: its vectors were encoded so, and
    queries encoded otherwise would be ranked against them without a word."""
    for option, field, given, recorded in (("--pooling", "pooling", pooling, manifest.pooling),
                                           ("--max-length", "max_length", max_length, manifest.max_length)):
        if given is not None and given != recorded:
            raise UserError(f"{option} {given}: the index {folder} was built with {field} {recorded!r} "
                            f"({MANIFEST}); leave {option} out to search it, or rebuild it with `mirrorbert index`")


def check_vectors_match_model(encoder, index, folder: Path, option: str = "--index") -> None:
    """Re-encode a few stored texts (the longest, where max_length bites, and some spread over the index) with
    the loaded model as the manifest configured it; each must give its stored vector (cosine >= SPOT_MIN_COSINE).
    The model's fingerprint says the weights are the same; this says the vectors are what these weights, this
    pooling and this maximum length make of these texts, which no manifest field alone can."""
    import numpy as np

    from mirrorbert.search.exact import l2_normalize

    texts = index.texts
    if texts is None or not len(texts):
        return
    rows = _spot_rows(texts)
    if not rows:
        return
    fresh = l2_normalize(encoder.encode([texts[r] for r in rows], normalize=True))
    stored = np.asarray(index.vectors[rows], dtype=np.float32)
    cosines = np.einsum("ij,ij->i", fresh.astype(np.float64), stored.astype(np.float64))
    bad = np.flatnonzero(~(cosines >= SPOT_MIN_COSINE))
    if bad.size:
        row = rows[int(bad[0])]
        raise UserError(f"{option} {folder}: vectors.npy row {row} is not what --model makes of its text "
                        f"(cosine {cosines[bad[0]]:.4f}) with the manifest's pooling {encoder.pooling!r} and "
                        f"max_length {encoder.max_length}: the index was built otherwise (its {MANIFEST} edited?) "
                        "or its vectors replaced; rebuild it with `mirrorbert index`")


def _spot_rows(texts) -> list[int]:
    """Up to SPOT_ROWS rows of at most SPOT_MAX_BYTES each: the longest half (by stored length) and the rest
    spread evenly over the index."""
    import numpy as np

    lengths = texts.lengths() if isinstance(texts, StoredTexts) else np.array([len(t) for t in texts])
    eligible = np.flatnonzero(lengths <= SPOT_MAX_BYTES)
    longest = eligible[np.argsort(-lengths[eligible], kind="stable")[:SPOT_ROWS // 2]]
    picks = np.linspace(0, len(eligible) - 1, num=min(len(eligible), SPOT_ROWS - len(longest))).astype(int)
    return sorted(set(longest.tolist()) | set(eligible[picks].tolist()))


def _read_checked(folder: ConfinedFolder, name: str, manifest: Manifest, limit: int) -> bytes:
    """A file of the index, its size bounded, its SHA-256 matched against the manifest's when recorded."""
    raw = folder.read_bytes(name, limit)
    expected = (manifest.files or {}).get(name)
    if expected is not None and hashlib.sha256(raw).hexdigest() != expected:
        raise _damaged(folder, name, "its SHA-256 is not the one recorded in manifest.json")
    return raw


def _read_texts(folder: ConfinedFolder, manifest: Manifest, corpus: "CorpusRecords | None" = None) -> "StoredTexts":
    """texts.jsonl, one JSON string a line: the file is hashed in one streaming pass, then every line parsed
    (checked, and with `corpus` compared with the corpus's record) from the same open file, keeping only where
    each line starts (8 bytes a row, not the strings). A line is read at most MAX_TEXT_LINE bytes at a time."""
    import numpy as np

    name = "texts.jsonl"
    fh = open_member(folder, name, 1 << 34)
    try:
        expected = (manifest.files or {}).get(name)
        if expected is not None and stream_sha256(fh) != expected:
            raise _damaged(folder, name, "its SHA-256 is not the one recorded in manifest.json")
        fh.seek(0)
        starts = np.zeros(manifest.rows + 1, dtype=np.int64)
        position = lineno = 0
        while line := fh.readline(MAX_TEXT_LINE + 1):
            lineno += 1
            if lineno > manifest.rows:
                raise _damaged(folder, name, f"{lineno + _newlines(fh)} lines, manifest.json says "
                                             f"{manifest.rows} rows")
            if len(line) > MAX_TEXT_LINE:
                raise _damaged(folder, f"{name}:{lineno}", f"a line longer than {MAX_TEXT_LINE} bytes")
            text = _parse_text(folder, f"{name}:{lineno}", line[:-1] if line.endswith(b"\n") else line)
            if corpus is not None:
                corpus.check(lineno - 1, text)
            position += len(line)
            starts[lineno] = position
        if lineno != manifest.rows:
            raise _damaged(folder, name, f"{lineno} lines, manifest.json says {manifest.rows} rows")
        if corpus is not None:
            corpus.finish()
    except BaseException:
        fh.close()
        raise
    return StoredTexts(folder, PositionedReader(fh), starts)


def _newlines(fh) -> int:
    """Line ends left in an open file, counted a block at a time."""
    return sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 22), b""))


class CorpusRecords:
    """The corpus's non-blank records (a file given with --corpus, already matched against the manifest's
    SHA-256), walked beside texts.jsonl: row i of the index must be the i-th of them, its id that record's id
    and its stored text that record's text. So the hits' texts and ids are the corpus's, not the folder's word."""

    def __init__(self, corpus: str | Path, manifest: Manifest, ids, skip_bad_lines: bool, folder: ConfinedFolder):
        self.path, self.manifest, self.ids, self.folder = Path(corpus), manifest, ids, folder
        self.records = _non_blank_records(self.path, manifest, skip_bad_lines)

    def check(self, row: int, text: str) -> None:
        record = next(self.records, None)
        if record is None:
            raise UserError(f"--corpus {self.path}: {row} entries, but the index {self.folder.given} has "
                            f"{self.manifest.rows} rows: not the corpus it was built from; rebuild it with "
                            "`mirrorbert index`")
        record_id, expected = record
        if int(self.ids[row]) != record_id:
            raise _damaged(self.folder, self.manifest.ids_file, f"entry {row} is {int(self.ids[row])}, but the "
                                                                f"corpus's entry {row} is its record {record_id}")
        if text != expected:
            raise _damaged(self.folder, f"texts.jsonl:{row + 1}", f"not the text of record {record_id} of "
                                                                  f"--corpus {self.path}")

    def finish(self) -> None:
        if next(self.records, None) is not None:
            raise UserError(f"--corpus {self.path}: more entries than the {self.manifest.rows} rows of the index "
                            f"{self.folder.given}: not the corpus it was built from; rebuild it with "
                            "`mirrorbert index`")


def _non_blank_records(path: Path, manifest: Manifest, skip_bad_lines: bool):
    """(record id, text) of the corpus's non-blank records, read as `mirrorbert index` read them (the manifest's
    --column/--field; a table row's id is its place)."""
    from mirrorbert.data.hf_datasets import input_kind, iter_table_column
    from mirrorbert.data.readers import iter_records, read_errors

    if input_kind(path, "--corpus") == "table":
        position = 0
        for chunk in iter_table_column(path, manifest.column, "--corpus"):
            for text in chunk:
                if text.strip():
                    yield position, text
                position += 1
        return
    with read_errors(path, "--corpus"):
        for record_id, text in iter_records(path, manifest.column, manifest.field, skip_bad_lines, [], "--corpus"):
            if text.strip():
                yield record_id, text


class StoredTexts(collections.abc.Sequence):
    """The index's texts, read from texts.jsonl when a hit needs one: a 10M-row index holds 80 MB of line
    starts instead of gigabytes of strings. The file stays open (the one that was checked); each line is
    parsed and checked again as it is read."""

    def __init__(self, folder: ConfinedFolder, reader: PositionedReader, starts):
        self.folder, self._reader, self._starts = folder, reader, starts

    def __len__(self) -> int:
        return len(self._starts) - 1

    def lengths(self):
        """Each row's stored line length in bytes (an array), without reading the texts."""
        import numpy as np

        return np.diff(self._starts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]
        start, end = int(self._starts[index]), int(self._starts[index + 1])
        line = self._reader.read(start, end - start)
        return _parse_text(self.folder, f"texts.jsonl:{index + 1}", line[:-1] if line.endswith(b"\n") else line)

    def close(self) -> None:
        self._reader.close()


def _parse_text(folder: ConfinedFolder, where: str, line: bytes) -> str:
    """One line of texts.jsonl: a JSON string (nothing nested), valid UTF-8, no lone surrogate."""
    if not line.startswith(b'"'):
        raise _damaged(folder, where, "expected a JSON string")
    try:
        text = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _damaged(folder, where, f"not a JSON string: {str(exc)[:80]}") from None
    if not isinstance(text, str):
        raise _damaged(folder, where, "expected a JSON string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape: not text, and unprintable as a hit
        raise _damaged(folder, where, "a lone surrogate escape, not text") from None
    return text


def _read_ids(folder: ConfinedFolder, manifest: Manifest) -> list[int]:
    """ids.json: a flat list of `rows` increasing line numbers below the corpus's line count; its size
    bounded (21 bytes an id) and its nesting checked before parsing."""
    name = "ids.json"
    raw = _read_checked(folder, name, manifest, 64 + 24 * manifest.rows)
    ids = parse_json(raw, folder.option, folder.given / name)
    if not isinstance(ids, list):
        raise _damaged(folder, name, f"expected a list of line numbers, found {type(ids).__name__}")
    if len(ids) != manifest.rows:
        raise _damaged(folder, name, f"{len(ids)} ids, manifest.json says {manifest.rows} rows")
    previous = -1
    for position, value in enumerate(ids):
        if not _is_int(value, 0) or value >= manifest.corpus_lines:
            raise _damaged(folder, name, f"entry {position} is {str(value)[:40]!r}, not a line number of the "
                                         f"corpus (0 to {manifest.corpus_lines - 1})")
        if value <= previous:
            raise _damaged(folder, name, f"entry {position} ({value}) is not after the one before it")
        previous = value
    return ids


def _read_faiss(folder: ConfinedFolder, manifest: Manifest, vectors):
    """The stored faiss index, read after its checksum matched, holding exactly the rows of vectors.npy."""
    import faiss

    name = "faiss.index"
    raw = _read_checked(folder, name, manifest, 4096 + manifest.rows * manifest.dim * 4)
    import numpy as np

    try:
        index = faiss.deserialize_index(np.frombuffer(raw, dtype=np.uint8))
    except Exception as exc:  # noqa: BLE001  faiss raises RuntimeError with a C++ trace for a damaged file
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise _damaged(folder, name, f"faiss cannot read it: {reason}") from None
    if index.ntotal != manifest.rows or index.d != manifest.dim:
        raise _damaged(folder, name, f"{index.ntotal} vectors of dimension {index.d}, manifest.json says "
                                     f"{manifest.rows} of {manifest.dim}")
    # faiss 1.7 reads back the generic class, later ones the concrete one; the downcast view does not own the
    # index, so `index` (which does) is what is kept and returned
    concrete = faiss.downcast_index(index)
    if not (isinstance(concrete, faiss.IndexFlat) and concrete.metric_type == faiss.METRIC_INNER_PRODUCT):
        raise _damaged(folder, name, f"a {type(concrete).__name__}, expected an exact IndexFlatIP")
    if not np.array_equal(index.reconstruct_n(0, index.ntotal), vectors):  # proposes candidates: must be ours
        raise _damaged(folder, name, "its vectors are not those of vectors.npy")
    return index


def load_index(folder: Path, manifest: Manifest, use_faiss: bool | None, corpus: str | Path | None = None,
               skip_bad_lines: bool = False, option: str = "--index"):
    """(SearchIndex, ids) from the folder, every file read through the confined reader and checked against the
    manifest first; the vectors memory-mapped. With `corpus` (matched against the manifest by `check_index`)
    the ids and texts are checked against its records too. The stored faiss index (exact) or the IVF index
    rebuilt from its parts (ivf) is used when faiss is wanted and present; without it (or with
    `use_faiss=False`) search is an exact scan."""
    from mirrorbert.search.exact import SearchIndex, wants_faiss

    confined = ConfinedFolder(folder, option, "index folder")
    _check_checksums_listed(confined, manifest)
    files = manifest.files or {}
    vectors = open_vectors(confined, manifest.rows, manifest.dim, files.get("vectors.npy"))
    if manifest.ids_file == "ids.json":
        ids = _read_ids(confined, manifest)
    else:
        ids = read_ids_npy(confined, manifest.rows, manifest.corpus_lines, files.get("ids.npy"))
    records = CorpusRecords(corpus, manifest, ids, skip_bad_lines, confined) if corpus is not None else None
    texts = _read_texts(confined, manifest, records)
    index = SearchIndex(vectors, texts, meta={"model": manifest.model, "pooling": manifest.pooling})
    if manifest.index_type == "ivf":
        if wants_faiss(use_faiss):
            index.approximate = _read_ivf(confined, manifest, index.vectors)
    elif manifest.faiss and wants_faiss(use_faiss) and confined.exists("faiss.index"):
        if manifest.files is not None and "faiss.index" not in manifest.files:
            raise UserError(f"{option} {Path(folder) / MANIFEST}: damaged (no checksum for faiss.index)")
        index.faiss_index = _read_faiss(confined, manifest, index.vectors)
    return index, ids


def _check_checksums_listed(folder: ConfinedFolder, manifest: Manifest) -> None:
    """Every file the index reads has its checksum in the manifest (or, written before checksums, a warning)."""
    if manifest.files is None:
        logger.warning("%s: an index written before mirrorbert recorded checksums; its files are checked for "
                       "structure only (rebuild it with `mirrorbert index` to have them checked fully)", folder.given)
        return
    needed = ["vectors.npy", "texts.jsonl", manifest.ids_file, *(IVF_FILES if manifest.index_type == "ivf" else ())]
    for name in needed:
        if name not in manifest.files:
            raise UserError(f"{folder.option} {folder.given / MANIFEST}: damaged (no checksum for {name})")


def _read_ivf(folder: ConfinedFolder, manifest: Manifest, vectors):
    """The IVF index: its parts checked (index_files.read_ivf_parts), then rebuilt over the vectors."""
    from mirrorbert.search.approximate import IVFIndex, ivf_from_parts

    parts = read_ivf_parts(folder, manifest.rows, manifest.dim, manifest.ivf, manifest.files)
    return IVFIndex(ivf_from_parts(vectors, parts), parts)


__all__ = ["CorpusRecords", "Manifest", "check_index", "check_settings", "check_vectors_match_model",
           "corpus_sha256", "corpus_size", "file_sha256", "load_index", "model_fingerprint", "open_regular",
           "regular_files", "write_index"]
