"""Publishing a saved model on the Hugging Face Hub: `mirrorbert push`, `train --push-to-hub`, `Encoder.push_to_hub`.

What goes up is the saved folder as transformers and sentence-transformers read it (weights, config,
tokenizer, `modules.json` and the pooling config), `mirrorbert.json` and the model card, and nothing of
mirrorbert's own bookkeeping: the write policy's marker (`.mirrorbert-output`), locks and temporaries (every
dot-file), checkpoints (`step-N/`, `best-model/`) and folders that are outputs of their own. The card is
rendered again for the repo (its usage snippets then load the repo id) unless it was edited since mirrorbert
wrote it; an edited card goes up as it is.

A dry run writes exactly the files that would be uploaded into a folder, through the write policy, and
touches no network. The real push stages the same files (hard links where possible) in a temporary folder
beside the model and calls `HfApi.create_repo(exist_ok=True)` and `HfApi.upload_folder`; a network or Hub
error becomes one `UserError` line naming the repo.

Nothing here imports torch or transformers: `mirrorbert push` never loads the model.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirrorbert.errors import UserError, first_line
from mirrorbert.safeguards.writes import remove_tree

DEFAULT_COMMIT_MESSAGE = "Upload a sentence encoder trained with mirrorbert"
# The Hub's rules for one part of a repo id (huggingface_hub.utils.validate_repo_id): 1 to 96 of
# [A-Za-z0-9_.-], starting and ending with a letter, digit or underscore; no "--" or ".."; not ending ".git".
_REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
MIRRORBERT_JSON = "mirrorbert.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")
# Checkpoint folders a training output may hold (training/checkpoints.py): never part of the published model.
CHECKPOINT_DIR = re.compile(r"^(step-\d+|best-model)$")


# ----------------------------------------------------------------------------- checks (no network, no model load)
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


def _json_file(path: Path, option: str, shown: Any, expect: type) -> Any:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{option} {shown}: {path.name} is damaged ({first_line(exc)})") from None
    if not isinstance(value, expect):
        raise UserError(f"{option} {shown}: {path.name} is damaged (expected a JSON "
                        f"{'object' if expect is dict else 'list'})")
    return value


def check_model_folder(folder: Any, option: str = "--model") -> Path:
    """The folder of a model saved by mirrorbert (`train --output`, `Encoder.save`), checked from its files alone."""
    if folder is None or not str(folder).strip():
        raise UserError(f"{option}: must not be empty; give the folder of a model saved by mirrorbert")
    path = Path(os.path.expanduser(str(folder)))
    if not path.exists():
        raise UserError(f"{option} {folder}: not found (give a local folder saved by mirrorbert: the --output of "
                        f"`mirrorbert train`, or one written by Encoder.save)")
    if not path.is_dir():
        raise UserError(f"{option} {folder}: is a file, not a model folder")
    if not (path / MIRRORBERT_JSON).is_file():
        raise UserError(f"{option} {folder}: not a model folder saved by mirrorbert (no {MIRRORBERT_JSON}); "
                        f"save it with `mirrorbert train --output` or Encoder.save first")
    _json_file(path / MIRRORBERT_JSON, option, folder, dict)
    if not (path / "config.json").is_file():
        raise UserError(f"{option} {folder}: incomplete, it has no config.json")
    _json_file(path / "config.json", option, folder, dict)
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise UserError(f"{option} {folder}: incomplete, it has no weights ({', '.join(WEIGHT_FILES[::2])})")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(f"{option} {folder}: incomplete, it has no tokenizer files")
    if not (path / "modules.json").is_file():
        raise UserError(f"{option} {folder}: incomplete, it has no modules.json (sentence-transformers could not "
                        f"load it)")
    modules = _json_file(path / "modules.json", option, folder, list)
    for module in modules:
        if not isinstance(module, dict) or not isinstance(module.get("path", ""), str):
            raise UserError(f"{option} {folder}: modules.json is damaged (not the sentence-transformers layout)")
        if module.get("path") and not (path / module["path"]).is_dir():
            raise UserError(f"{option} {folder}: incomplete, modules.json names {module['path']}/, which is missing")
    return path


# ----------------------------------------------------------------------------- what is uploaded
def upload_files(folder: str | Path, option: str = "--model") -> list[str]:
    """The files of a saved model folder that go to the Hub (relative POSIX paths, sorted): everything but
    dot-files and dot-folders (the write policy's marker, locks, temporaries), checkpoint folders and
    subfolders holding an output of their own. Only regular files inside the folder go out: a symlink (to a
    token elsewhere, or to a file inside), a device, FIFO or socket among them is refused, naming it."""
    from mirrorbert.safeguards.writes import MARKER, kind_of

    folder = Path(folder)
    found = []
    for root, dirs, files in os.walk(folder):
        base = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not CHECKPOINT_DIR.match(d)
                         and not (base / d / MARKER).exists())
        for name in [*dirs, *files]:
            if name.startswith("."):
                continue
            kind = kind_of(base / name, follow=False)
            if kind not in ("a file", "a folder"):
                what = f"a symlink to {os.readlink(base / name)}" if kind == "a symlink" else kind
                raise UserError(f"{option} {folder}: {(base / name).relative_to(folder).as_posix()} is {what}; "
                                f"only regular files inside the model folder are published (copy the file in or "
                                f"remove it)")
        found += [(base / f).relative_to(folder).as_posix() for f in files if not f.startswith(".")]
    return sorted(found)


@dataclass
class Upload:
    """The files one push sends: relative path -> the source file, or the card's text when it is rendered."""

    folder: Path
    repo_id: str
    sources: dict[str, Path] = field(default_factory=dict)
    card: str | None = None
    card_note: str = ""

    @property
    def files(self) -> list[str]:
        from mirrorbert.publish.model_card import CARD_FILE

        return sorted({*self.sources, *([CARD_FILE] if self.card is not None else [])})

    @property
    def bytes(self) -> int:
        from mirrorbert.publish.model_card import CARD_FILE

        total = sum(p.stat().st_size for rel, p in self.sources.items() if not (rel == CARD_FILE and self.card))
        return total + (len(self.card.encode("utf-8")) if self.card is not None else 0)

    def write(self, dest: str | Path, link: bool = False, option: str = "--model") -> None:
        """Put the files into `dest` (an empty folder): copies, or hard links where `link` and the filesystem allow
        (each source checked again to be a regular file, on the descriptor it is copied from)."""
        from mirrorbert.publish.model_card import CARD_FILE
        from mirrorbert.safeguards.writes import copy_regular_file

        dest = Path(dest)
        for rel in self.files:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if rel == CARD_FILE and self.card is not None:
                target.write_text(self.card, encoding="utf-8")
                continue
            copy_regular_file(self.sources[rel], target, option, self.folder, link=link)

    def record(self) -> dict[str, Any]:
        return {"repo": self.repo_id, "model": str(self.folder), "files": self.files, "bytes": self.bytes,
                "card": self.card_note}


def plan_upload(folder: str | Path, repo_id: str, render_card: bool | None = None,
                option: str = "--model") -> Upload:
    """What pushing `folder` to `repo_id` sends. `render_card`: None renders the card for the repo unless it
    was edited since mirrorbert wrote it (the write policy's marker records its digest); True/False force it."""
    from mirrorbert.publish.model_card import CARD_FILE, render_model_card
    from mirrorbert.safeguards.writes import _digest, read_marker

    folder = Path(folder)
    sources = {rel: folder / rel for rel in upload_files(folder, option)}
    card_path = folder / CARD_FILE
    if render_card is None:
        marker = read_marker(folder) or {}
        digests = marker.get("digests") if isinstance(marker.get("digests"), dict) else {}
        recorded = digests.get(CARD_FILE)
        render_card = not card_path.is_file() or (recorded is not None and _digest(card_path) == list(recorded))
        note = ("written for the repo from mirrorbert.json" if not card_path.is_file() else
                "rendered for the repo" if render_card else
                "uploaded as it is (edited since mirrorbert wrote it, or written by another tool)")
    else:
        note = "rendered for the repo" if render_card else "uploaded as it is"
    card = None
    if render_card:
        meta = json.loads((folder / MIRRORBERT_JSON).read_text(encoding="utf-8"))
        card = render_model_card(meta, folder=folder, name=repo_id, hub=True)
    return Upload(folder, repo_id, sources, card, note)


# ----------------------------------------------------------------------------- dry run and push
def dry_run(folder: str | Path, repo_id: str, output: str | Path, overwrite: bool = False, *,
            model_option: str = "--model", repo_option: str = "--repo", output_option: str = "--output",
            render_card: bool | None = None) -> dict[str, Any]:
    """Write into `output` exactly the files a push of `folder` to `repo_id` would upload; no network.

    `output` follows the write policy (refused inside the model folder, an existing folder only with
    `overwrite` and only when mirrorbert wrote all of it); like every folder mirrorbert writes, it also gets
    the policy's marker, which a push of it leaves out in turn.
    """
    from mirrorbert.safeguards.writes import WritePlan, atomic_output_dir

    repo_id = check_repo_id(repo_id, repo_option)
    plan = WritePlan({model_option: folder}, overwrite=overwrite).folder(output_option, output)
    with plan.locked():
        path = check_model_folder(folder, model_option)
        upload = plan_upload(path, repo_id, render_card, model_option)
        with atomic_output_dir(output, overwrite=overwrite, option=output_option) as tmp:
            upload.write(tmp, option=model_option)
    return {**upload.record(), "dry_run": True, "output": str(output)}


def _hub_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises when the Hub cannot be reached or refuses: its HTTP errors (httpx's or
    requests', by version), offline mode and connection errors (ConnectionError), a missing token (OSError)."""
    errors: list[type[BaseException]] = [OSError, TimeoutError, ValueError]
    try:
        from huggingface_hub import errors as hub_errors

        errors += [e for e in (getattr(hub_errors, "HTTPError", None),) if isinstance(e, type)]
    except ImportError:  # pragma: no cover - older huggingface_hub
        pass
    try:
        import requests

        errors.append(requests.RequestException)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


def _staging_dir(folder: Path) -> Path:
    """A temporary folder beside the model (hard links work there), else in the system's temporary folder.
    Its name is one the write policy knows as a mirrorbert temporary."""
    try:
        return Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-push-", dir=folder.resolve().parent))
    except OSError:
        return Path(tempfile.mkdtemp(prefix="mirrorbert-push-"))


def push_folder(folder: str | Path, repo_id: str, *, private: bool | None = None, token: str | None = None,
                commit_message: str | None = None, model_option: str = "--model", repo_option: str = "--repo",
                render_card: bool | None = None) -> dict[str, Any]:
    """Upload a saved model folder to the Hub repo `repo_id` (created when missing); returns what was sent.

    `private`: the visibility of a repo created now (None: the Hub's default; an existing repo keeps its own).
    `token`: a Hub token (default: `HF_TOKEN` or the login saved by `hf auth login`).
    """
    repo_id = check_repo_id(repo_id, repo_option)
    path = check_model_folder(folder, model_option)
    upload = plan_upload(path, repo_id, render_card, model_option)
    try:
        from huggingface_hub import HfApi
    except ImportError:  # pragma: no cover - transformers depends on it
        raise UserError(f"{repo_option} {repo_id}: pushing needs the huggingface_hub package "
                        f"(pip install huggingface_hub)") from None
    staging = _staging_dir(path)
    try:
        upload.write(staging, link=True, option=model_option)
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
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
    """`Encoder.push_to_hub`: save the encoder into a temporary folder, then push it (or dry-run it)."""
    repo_id = check_repo_id(repo_id, "repo_id")
    if dry_run_dir is not None:
        from mirrorbert.safeguards.writes import WritePlan

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


__all__ = ["DEFAULT_COMMIT_MESSAGE", "Upload", "check_model_folder", "check_repo_id", "dry_run", "plan_upload",
           "push_encoder", "push_folder", "upload_files"]
