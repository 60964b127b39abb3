"""Publishing a model on the Hugging Face Hub: `mirrorbert push`, `train --push-to-hub` (a saved folder) and
`push_encoder` (an encoder in memory, saved into a temporary folder first). What goes up is the saved folder
without mirrorbert's bookkeeping (dot-files, checkpoints, nested outputs), each file copied from a descriptor
checked to be the very file listed (docs/design.md, "What a push sends"); a link, FIFO, socket or device is
refused. A dry run writes exactly those files and touches no network; a Hub error is one `UserError` line.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from mirrorbert.errors import UserError, first_line
from mirrorbert.publish.model_card import CARD_FILE, render_model_card
from mirrorbert.safeguards.confined import ConfinedFolder
from mirrorbert.safeguards.readback import describe_kind, opening, stream_sha256
from mirrorbert.safeguards.writes import MARKER, WritePlan, atomic_output_dir, remove_tree

DEFAULT_COMMIT_MESSAGE = "Upload a sentence encoder trained with mirrorbert"
# one part of a repo id, by the Hub's rules (huggingface_hub.utils.validate_repo_id)
_REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
MIRRORBERT_JSON = "mirrorbert.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")
CHECKPOINT_DIR = re.compile(r"^(step-\d+|best-model)$")
MARKER_LIMIT = 64 << 20  # the write policy's marker lists each file of the folder with its digest


def check_repo_id(repo_id: Any, option: str = "--repo") -> str:
    """`repo_id` if it names a Hub model repo as USER/NAME (or ORG/NAME); otherwise a UserError naming `option`."""
    text = repo_id if isinstance(repo_id, str) else None
    parts = text.split("/") if text else []
    why = None
    if not text:
        why = "must not be empty"
    elif len(parts) != 2:
        why = "expected USER/NAME or ORG/NAME (one '/')"
    elif not all(_REPO_PART.fullmatch(part) for part in parts):
        why = ("each part is 1 to 96 letters, digits, '-', '_' or '.', starting and ending with a letter, digit "
               "or '_'")
    elif "--" in text or ".." in text:
        why = "'--' and '..' are not allowed"
    elif text.endswith(".git"):
        why = "may not end with '.git'"
    if why:
        raise UserError(f"{option} {repo_id!r}: not a Hugging Face Hub repo id; {why}")
    return text


# the card's other sources besides mirrorbert.json and the module configs, checked with the folder
CARD_SOURCES = ("sentence_bert_config.json", "config_sentence_transformers.json")


def _model_path(folder: Any, option: str) -> Path:
    if folder is None or not str(folder).strip():
        raise UserError(f"{option}: must not be empty; give the folder of a model saved by mirrorbert")
    path = Path(os.path.expanduser(str(folder)))
    if not path.exists():
        raise UserError(f"{option} {folder}: not found (give a local folder saved by mirrorbert: the --output of "
                        f"`mirrorbert train`, or one written by Encoder.save)")
    if not path.is_dir():
        raise UserError(f"{option} {folder}: is a file, not a model folder")
    return path


def open_model_folder(folder: Any, option: str = "--model") -> ConfinedFolder:
    """The folder of a model saved by mirrorbert (`train --output`, `Encoder.save`), checked from its files alone,
    every one read through `ConfinedFolder`: a file, or a module folder named in modules.json, that leads out
    of the folder is refused, naming it."""
    model = ConfinedFolder(_model_path(folder, option), option, kind="model folder")
    if not model.exists(MIRRORBERT_JSON):
        raise UserError(f"{option} {folder}: not a model folder saved by mirrorbert (no {MIRRORBERT_JSON}); "
                        f"save it with `mirrorbert train --output` or Encoder.save first")
    model.read_json(MIRRORBERT_JSON, dict)
    if not model.exists("config.json"):
        raise UserError(f"{option} {folder}: incomplete, it has no config.json")
    model.read_json("config.json", dict)
    if not any(model.exists(name) for name in WEIGHT_FILES):
        raise UserError(f"{option} {folder}: incomplete, it has no weights ({', '.join(WEIGHT_FILES[::2])})")
    if not any(model.exists(name) for name in TOKENIZER_FILES):
        raise UserError(f"{option} {folder}: incomplete, it has no tokenizer files")
    if not model.exists("modules.json"):
        raise UserError(f"{option} {folder}: incomplete, it has no modules.json (sentence-transformers could not "
                        f"load it)")
    _check_modules(model, model.read_json("modules.json", list))
    for name in CARD_SOURCES:
        if model.exists(name):
            model.read_json(name, dict)
    return model


def _check_modules(model: ConfinedFolder, modules: list) -> None:
    """Each module of modules.json is an object whose folder (if any) lies inside the model folder; the
    module's config.json, which the card shows, is JSON read from there."""
    for module in modules:
        if not isinstance(module, dict) or not isinstance(module.get("path", ""), str):
            raise model.refuse("modules.json", "damaged (not the sentence-transformers layout)")
        if module.get("path"):
            sub = model.subfolder(module["path"], named_in="modules.json")
            if sub.exists("config.json"):
                sub.read_json("config.json", dict)


PUBLISHED = "only regular files inside the model folder, each its only link, are published"


def _refusal(model: ConfinedFolder, rel: str, st: os.stat_result) -> UserError | None:
    """Why the entry `rel` (its lstat `st`) may not go out, or None: a symlink may bring a file from anywhere,
    and so may a hard link (its other name can lie outside the folder); a FIFO, socket or device is no file."""
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            what = f"a symlink to {os.readlink(model.root / rel)}"
        except OSError:
            what = "a symlink"
    elif stat.S_ISREG(st.st_mode):
        what = f"a hard link ({st.st_nlink} names of one file; another may lie outside the folder)"
    else:
        what = describe_kind(st.st_mode)
    return UserError(f"{model.option} {model.given}: {rel} is {what}; {PUBLISHED} (copy the file in or remove it)")


def _left_out(model: ConfinedFolder, rel: str, name: str, st: os.stat_result) -> bool:
    """mirrorbert's own bookkeeping: dot-entries (marker, locks, temporaries), checkpoints, nested outputs."""
    if name.startswith("."):
        return True
    return stat.S_ISDIR(st.st_mode) and (bool(CHECKPOINT_DIR.match(name)) or model.exists(f"{rel}/{MARKER}"))


def list_upload(model: ConfinedFolder) -> dict[str, os.stat_result]:
    """The files of a model folder that go to the Hub (relative POSIX path -> its lstat, sorted by path); an
    entry that may not go out (see `_refusal`) is refused, naming it. Links are never followed."""
    found: dict[str, os.stat_result] = {}
    pending = ["."]
    while pending:
        base = pending.pop()
        for name, st in model.entries(base):
            rel = name if base == "." else f"{base}/{name}"
            if _left_out(model, rel, name, st):
                continue
            if stat.S_ISDIR(st.st_mode):
                pending.append(rel)
                continue
            problem = _refusal(model, rel, st)
            if problem is not None:
                raise problem
            found[rel] = st
    return dict(sorted(found.items()))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def open_listed(model: ConfinedFolder, rel: str, listed: os.stat_result) -> Iterator[list[int]]:
    """Descriptors of the model folder, of each folder on the way to the listed file `rel` and of the file (last),
    opened one at a time without following a link and closed on exit; the file checked on its descriptor to be the
    very file that was listed (same device and inode, regular, one link). Anything else is refused, naming `rel`."""
    changed = model.refuse(rel, f"changed since the folder was listed (replaced, or a link swapped in); "
                                f"{PUBLISHED}")
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(model.root, _DIR_FLAGS))
            for part in rel.split("/")[:-1]:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            fds.append(os.open(rel.rsplit("/", 1)[-1], _FILE_FLAGS, dir_fd=fds[-1]))
        except OSError:
            raise changed from None
        st = os.fstat(fds[-1])
        if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and os.path.samestat(st, listed)):
            raise changed
        os.set_blocking(fds[-1], True)
        yield fds
    finally:
        for fd in reversed(fds):
            os.close(fd)


class PublishedFolder(ConfinedFolder):
    """The model folder as a push sees it, for the card: a file is read only if it is one of the files that
    go up, and only as the very file that was listed. So a module folder that is left out of the upload (a
    dot-folder, a checkpoint) cannot bring a hard-linked file from outside into the card."""

    top: ConfinedFolder
    listing: dict[str, os.stat_result]

    @classmethod
    def of(cls, folder: ConfinedFolder, top: ConfinedFolder,
           listing: dict[str, os.stat_result]) -> "PublishedFolder":
        view = cls.__new__(cls)
        view.__dict__.update(folder.__dict__)
        view.top, view.listing = top, listing
        return view

    def subfolder(self, name: str, named_in: str | None = None) -> "PublishedFolder":
        return PublishedFolder.of(super().subfolder(name, named_in), self.top, self.listing)

    def open(self, name: str, limit: int | None = None, named_in: str | None = None) -> int:
        rel = Path(os.path.relpath(self.resolve(name, named_in), self.top.root)).as_posix()
        if rel not in self.listing:
            raise self.refuse(name, "is not one of the files that go up (the card is written from those only)",
                              named_in)
        with open_listed(self.top, rel, self.listing[rel]) as fds:
            if limit is not None and os.fstat(fds[-1]).st_size > limit:
                raise self.refuse(name, f"more than the {limit} bytes such a file may hold", named_in)
            return os.dup(fds[-1])


def _new_file(target: Path) -> BinaryIO:
    """A file mirrorbert creates in a folder of its own: never through a link, never over an existing one."""
    return os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "wb")


def _link_checked(fd: int, dir_fd: int, name: str, target: Path) -> bool:
    """Hard-link the checked file (by its folder's descriptor) to `target`; False where that fails or where the
    name no longer leads to the checked file (then it is copied from the descriptor instead)."""
    try:
        os.link(name, target, src_dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    if os.path.samestat(os.lstat(target), os.fstat(fd)):
        return True
    os.unlink(target)
    return False


@dataclass
class Upload:
    """The files one push sends: the listed files of the folder (relative path -> lstat at listing), and the
    card's text when it is rendered for the repo (then it replaces the folder's README.md)."""

    model: ConfinedFolder
    repo_id: str
    listing: dict[str, os.stat_result] = field(default_factory=dict)
    card: str | None = None
    card_note: str = ""

    @property
    def files(self) -> list[str]:
        return sorted({*self.listing, *([CARD_FILE] if self.card is not None else [])})

    @property
    def bytes(self) -> int:
        total = sum(st.st_size for rel, st in self.listing.items() if not (rel == CARD_FILE and self.card))
        return total + (len(self.card.encode("utf-8")) if self.card is not None else 0)

    def write(self, dest: str | Path, link: bool = False) -> None:
        """Put the files into `dest` (an empty folder of mirrorbert's): the rendered card, and each listed file
        copied (or hard-linked, where `link` and the filesystem allow) from the descriptor it was checked on."""
        dest = Path(dest)
        for rel in self.files:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if rel == CARD_FILE and self.card is not None:
                with _new_file(target) as out:
                    out.write(self.card.encode("utf-8"))
                continue
            with open_listed(self.model, rel, self.listing[rel]) as fds:
                if link and _link_checked(fds[-1], fds[-2], rel.rsplit("/", 1)[-1], target):
                    continue
                with _new_file(target) as out, os.fdopen(os.dup(fds[-1]), "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)

    def record(self) -> dict[str, Any]:
        return {"repo": self.repo_id, "model": str(self.model.given), "files": self.files, "bytes": self.bytes,
                "card": self.card_note}


def _card_digest(view: PublishedFolder) -> list:
    """[size, sha256] of the folder's listed README.md, as the write policy's marker records it."""
    with os.fdopen(view.open(CARD_FILE), "rb") as fh:
        return [os.fstat(fh.fileno()).st_size, stream_sha256(fh)]


def _recorded_card_digest(model: ConfinedFolder) -> list | None:
    """The card's digest in the folder's marker (None without one, or when the marker is no readable JSON
    file inside the folder: the card then counts as edited and goes up as it is)."""
    try:
        marker = model.read_json(MARKER, dict, limit=MARKER_LIMIT)
    except UserError:
        return None
    digests = marker.get("digests")
    recorded = digests.get(CARD_FILE) if isinstance(digests, dict) else None
    return list(recorded) if isinstance(recorded, list) else None


def plan_upload(model: ConfinedFolder, repo_id: str, render_card: bool | None = None) -> Upload:
    """What pushing `model` to `repo_id` sends. `render_card`: None renders the card for the repo unless it
    was edited since mirrorbert wrote it (the write policy's marker records its digest); True/False force it.
    The card is rendered from the folder's own files only (mirrorbert.json, modules.json, module configs)."""
    listing = list_upload(model)
    view = PublishedFolder.of(model, model, listing)
    if render_card is not None:
        note = "rendered for the repo" if render_card else "uploaded as it is"
    elif CARD_FILE not in listing:
        render_card, note = True, "written for the repo from mirrorbert.json"
    else:
        recorded = _recorded_card_digest(model)
        render_card = recorded is not None and _card_digest(view) == recorded
        note = ("rendered for the repo" if render_card else
                "uploaded as it is (edited since mirrorbert wrote it, or written by another tool)")
    return Upload(model, repo_id, listing, _render_card(view, repo_id) if render_card else None, note)


def _render_card(model: PublishedFolder, repo_id: str) -> str:
    """The card for the repo, from the folder's files that go up (mirrorbert.json and the module files); a
    field of a type the card cannot show (a list where a name belongs, an object where a count does) is a
    damaged mirrorbert.json, refused."""
    meta = model.read_json(MIRRORBERT_JSON, dict)
    try:
        return render_model_card(meta, folder=model, name=repo_id, hub=True)
    except UserError:  # a file of the folder, refused by name
        raise
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        raise model.refuse(MIRRORBERT_JSON, f"damaged (the model card cannot be written from it: "
                                            f"{type(exc).__name__}: {first_line(exc)})") from None


def dry_run(folder: str | Path, repo_id: str, output: str | Path, overwrite: bool = False, *,
            model_option: str = "--model", repo_option: str = "--repo", output_option: str = "--output",
            render_card: bool | None = None) -> dict[str, Any]:
    """Write into `output` exactly the files a push of `folder` to `repo_id` would upload; no network. `output`
    follows the write policy (an existing folder only with `overwrite` and only when mirrorbert wrote all of it)."""
    repo_id = check_repo_id(repo_id, repo_option)
    plan = WritePlan({model_option: folder}, overwrite=overwrite).folder(output_option, output)
    with plan.locked():
        upload = plan_upload(open_model_folder(folder, model_option), repo_id, render_card)
        with atomic_output_dir(output, overwrite=overwrite, option=output_option) as tmp:
            upload.write(tmp)
    return {**upload.record(), "dry_run": True, "output": str(output)}


def _hub_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises when the Hub cannot be reached or refuses: OSError (requests' errors, offline
    mode, a missing token), timeouts, ValueError, and from huggingface_hub 1.0 on httpx's HTTP errors."""
    errors: tuple[type[BaseException], ...] = (OSError, TimeoutError, ValueError)
    try:
        from huggingface_hub.errors import HTTPError
    except ImportError:  # pragma: no cover - its HTTP errors are requests' there (OSError)
        return errors
    return (*errors, HTTPError)


def _staging_dir(folder: Path) -> Path:
    """A temporary folder beside the model (hard links work there), else in the system's temporary folder.
    Its name is one the write policy knows as a mirrorbert temporary."""
    try:
        return Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-push-", dir=folder.parent))
    except OSError:
        return Path(tempfile.mkdtemp(prefix="mirrorbert-push-"))


def push_folder(folder: str | Path, repo_id: str, *, private: bool | None = None, token: str | None = None,
                commit_message: str | None = None, model_option: str = "--model", repo_option: str = "--repo",
                render_card: bool | None = None) -> dict[str, Any]:
    """Upload a saved model folder to the Hub repo `repo_id` (created when missing); returns what was sent.
    `private`: the visibility of a repo created now (None: the Hub's default; an existing repo keeps its own).
    `token`: a Hub token (default: `HF_TOKEN` or the login saved by `hf auth login`)."""
    repo_id = check_repo_id(repo_id, repo_option)
    model = open_model_folder(folder, model_option)
    upload = plan_upload(model, repo_id, render_card)
    from huggingface_hub import HfApi  # a dependency of transformers

    staging = _staging_dir(model.root)
    try:
        upload.write(staging, link=True)
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            with opening():  # the staging folder is the boundary's own: links to the files checked above
                commit = api.upload_folder(repo_id=repo_id, folder_path=str(staging), repo_type="model",
                                           commit_message=commit_message or DEFAULT_COMMIT_MESSAGE)
        except _hub_errors() as exc:
            raise UserError(f"{repo_option} {repo_id}: could not push to the Hugging Face Hub "
                            f"({type(exc).__name__}: {first_line(exc)}); check the network and the login "
                            f"(`hf auth login` or HF_TOKEN)") from None
    finally:
        remove_tree(staging)
    url = getattr(commit, "commit_url", None) or (commit if isinstance(commit, str) else None)
    return {**upload.record(), "url": f"https://huggingface.co/{repo_id}",
            **({"commit_url": str(url)} if url else {}), **({"private": private} if private is not None else {})}


def push_encoder(encoder, repo_id: str, *, private: bool | None = None, token: str | None = None,
                 commit_message: str | None = None, dry_run_dir: str | Path | None = None) -> dict[str, Any]:
    """Upload `encoder` (a `mirrorbert.Encoder`, or anything with its `write(folder)`) as `Encoder.save` writes it
    to the Hub repo `repo_id` ("user/name"; created when missing), pushed like `mirrorbert push` with a card whose
    snippets load `repo_id`; returns a record: repo, files, bytes (and the URL). `private`, `token`: as
    `push_folder`. `dry_run_dir`: no network; the files that would go up are written into this new folder. Errors
    are one `UserError` naming the argument (`repo_id`, `dry_run_dir`)."""
    repo_id = check_repo_id(repo_id, "repo_id")
    if dry_run_dir is not None:
        WritePlan({}).folder("dry_run_dir", dry_run_dir).check()  # before the encoder is written out
    with tempfile.TemporaryDirectory(prefix="mirrorbert-push-") as tmp:
        folder = Path(tmp) / "model"
        encoder.write(folder)
        if dry_run_dir is not None:
            record = dry_run(folder, repo_id, dry_run_dir, model_option="encoder", repo_option="repo_id",
                             output_option="dry_run_dir", render_card=True)
        else:
            record = push_folder(folder, repo_id, private=private, token=token, commit_message=commit_message,
                                 model_option="encoder", repo_option="repo_id", render_card=True)
    record.pop("model", None)  # a temporary folder, gone now
    return record


__all__ = ["DEFAULT_COMMIT_MESSAGE", "Upload", "check_repo_id", "dry_run", "list_upload", "open_listed",
           "open_model_folder", "plan_upload", "PublishedFolder", "push_encoder", "push_folder"]
