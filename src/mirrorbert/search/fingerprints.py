"""What an index was built from, as checksums an index folder records (search/index_claims.py): the model's
files and the corpus's bytes. Every folder is walked through `ConfinedFolder`: a link leading out of it, or a
FIFO or device inside it, is refused, never hashed or waited on.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from mirrorbert.data.hf_datasets import count_rows, is_dataset_folder, is_table
from mirrorbert.data.readers import shown
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import describe_kind, file_sha256, open_regular, read_errors, stream_sha256

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


def _folder_sha256(folder: ConfinedFolder, rels) -> str:
    """SHA-256 over these files' names and SHA-256s."""
    digest = hashlib.sha256()
    for rel in rels:
        with os.fdopen(folder.open(rel), "rb") as fh:
            digest.update(rel.encode("utf-8") + b"\0" + stream_sha256(fh).encode("ascii") + b"\n")
    return digest.hexdigest()


def corpus_size(path: Path, option: str = "--corpus") -> int:
    """Bytes of a corpus file, or of a dataset folder's regular files together (each checked as it is read)."""
    path = Path(path)
    if is_dataset_folder(path):
        folder = ConfinedFolder(path, option, "dataset folder")
        return sum(os.stat(real).st_size for _, real in regular_files(folder))
    with os.fdopen(open_regular(path, option), "rb") as fh:
        return os.fstat(fh.fileno()).st_size


def corpus_sha256(path: Path, option: str = "--corpus") -> str:
    """SHA-256 of a corpus file; of a dataset folder, over its regular files' names and checksums (as
    `safeguards.readback.file_sha256` digests a folder)."""
    path = Path(path)
    if not is_dataset_folder(path):
        return file_sha256(path, what=option)
    folder = ConfinedFolder(path, option, "dataset folder")
    return _folder_sha256(folder, [rel for rel, _ in regular_files(folder)])


def model_fingerprint(model: str) -> str:
    """SHA-256 over the model folder's weight, config and tokenizer files (names and bytes), or `hub:<id>` for
    a hub id (the id names the model)."""
    if not Path(model).is_dir():
        return f"hub:{model}"
    folder = ConfinedFolder(model, "--model", "model folder")
    names = [(rel, rel.rpartition("/")[2]) for rel, _ in regular_files(folder)]
    return _folder_sha256(folder, [rel for rel, name in names if name not in IGNORED_MODEL_FILES
                                   and Path(name).suffix in MODEL_FILE_SUFFIXES and not rel.startswith(".")])


def corpus_digest(path: Path, option: str = "--corpus") -> tuple[str, int]:
    """(SHA-256, lines) of a corpus: `corpus_sha256`, and its lines as every reader counts them (ended by LF or
    CRLF, a last one without an end counted too, whatever the encoding) or a table's rows; a text file in one pass."""
    path = Path(path)
    if is_table(path):
        return corpus_sha256(path, option), count_rows(path, option)
    digest, lines, last = hashlib.sha256(), 0, b"\n"
    with os.fdopen(open_regular(path, option), "rb") as fh, read_errors(path, option):
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
            lines, last = lines + block.count(b"\n"), block[-1:]
    return digest.hexdigest(), lines + (last != b"\n")


__all__ = ["IGNORED_MODEL_FILES", "MODEL_FILE_SUFFIXES", "corpus_digest", "corpus_sha256", "corpus_size",
           "model_fingerprint", "regular_files"]
