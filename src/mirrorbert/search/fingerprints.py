"""What an index was built from, as checksums: the model's files and the corpus's bytes.

An index folder records these (search/index_claims.py) so that a later search can tell that the model and the
corpus are still the ones its vectors and ids came from. Every folder is walked through the confined reader
(`safeguards.confined.ConfinedFolder`): a link leading out of it, or a FIFO or device inside it, is refused,
never hashed or waited on.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from mirrorbert.data.readers import shown
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import describe_kind, file_sha256, open_regular, stream_sha256

# Files whose bytes decide what a model computes; the rest (README, mirrorbert.json, training logs) do not.
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
IGNORED_MODEL_FILES = {"README.md", "mirrorbert.json", "manifest.json", ".mirrorbert-output"}
MAX_DEPTH = 32  # folders inside a model or dataset folder walked for its fingerprint


def regular_files(folder: ConfinedFolder, sub: str = "", depth: int = 0):
    """(relative name, resolved path) of every regular file under a confined folder, in the order of
    `sorted(Path.rglob)` (by path parts): links to files are followed only inside the folder, links to folders
    are not walked (as rglob does not), and a FIFO, device or socket is refused, never skipped."""
    if depth > MAX_DEPTH:
        raise folder.refuse(sub, f"folders nested more than {MAX_DEPTH} deep")
    found = []
    for name, st in folder.entries(sub or "."):
        rel = f"{sub}/{name}" if sub else name
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            try:
                mode = os.stat(folder.resolve(rel)).st_mode  # a link leading out is refused here
            except FileNotFoundError:  # a dangling link: nothing to read (rglob's is_file() skips it too)
                continue
            if stat.S_ISDIR(mode):
                continue
        if stat.S_ISDIR(mode):
            found.extend(regular_files(folder, rel, depth + 1))
        elif stat.S_ISREG(mode):
            found.append((rel, folder.resolve(rel)))
        else:
            raise folder.refuse(shown(rel), f"is {describe_kind(mode)}, expected a regular file")
    return sorted(found, key=lambda item: tuple(item[0].split("/"))) if depth == 0 else found


def _member_sha256(folder: ConfinedFolder, rel: str) -> str:
    with os.fdopen(folder.open(rel), "rb") as fh:
        return stream_sha256(fh)


def is_corpus_folder(path: Path) -> bool:
    from mirrorbert.data.hf_datasets import is_dataset_folder

    return os.path.isdir(path) and is_dataset_folder(path)


def corpus_size(path: Path, option: str = "--corpus") -> int:
    """Bytes of a corpus file, or of a dataset folder's regular files together (each checked as it is read)."""
    path = Path(path)
    if is_corpus_folder(path):
        folder = ConfinedFolder(path, option, "dataset folder")
        return sum(os.stat(real).st_size for _, real in regular_files(folder))
    with os.fdopen(open_regular(path, option), "rb") as fh:
        return os.fstat(fh.fileno()).st_size


def corpus_sha256(path: Path, option: str = "--corpus") -> str:
    """SHA-256 of a corpus file; of a dataset folder, over its regular files' names and checksums (the digest
    `safeguards.readback.file_sha256` gives a folder, but every member read through the confined reader)."""
    path = Path(path)
    if not is_corpus_folder(path):
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
    from mirrorbert.data.hf_datasets import count_rows, is_table
    from mirrorbert.data.readers import bounded_lines, open_input, split_lines

    if is_table(Path(path)):
        return count_rows(path, option)
    with open_input(Path(path), option) as fh:
        return sum(len(split_lines(raw)) for raw in bounded_lines(fh, Path(path)))


__all__ = ["IGNORED_MODEL_FILES", "MODEL_FILE_SUFFIXES", "corpus_sha256", "corpus_size", "count_lines",
           "is_corpus_folder", "model_fingerprint", "regular_files"]
