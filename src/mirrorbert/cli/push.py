"""`mirrorbert push`: upload a saved model folder to the Hugging Face Hub (or, with --dry-run, write what would
be uploaded); and the helpers behind `mirrorbert train --push-to-hub`.

Nothing heavy is imported here: the command never loads the model (see `mirrorbert.publish.hub`).
"""

from __future__ import annotations

import sys

import mirrorbert.jsonio as jsonio
from mirrorbert.cli import options
from mirrorbert.cli.options import use
from mirrorbert.errors import UserError

PUSH_TO_HUB_HELP = ("after training, upload the --output folder to this Hugging Face Hub repository (USER/NAME, "
                    "created when missing; the id is checked before training starts; as `mirrorbert push`)")


def add_push_parser(sub) -> None:
    from mirrorbert.publish.hub import DEFAULT_COMMIT_MESSAGE

    p = sub.add_parser(
        "push", help="upload a saved model folder to the Hugging Face Hub (model card included)",
        description="Upload a model folder saved by mirrorbert (`train --output`, Encoder.save) to a Hugging Face "
                    "Hub model repository, created when missing: weights, tokenizer, sentence-transformers files, "
                    "mirrorbert.json and the model card (rendered for the repo unless you edited it), without "
                    "mirrorbert's marker, lock and temporary files or checkpoints. Only regular files inside the "
                    "folder, each its only link, go up: a symlink, hard link, FIFO or device there is refused, "
                    "naming it. The login is huggingface_hub's "
                    "(HF_TOKEN or `hf auth login`). Prints a JSON record: repo, files, bytes, URL.",
    )
    options.add(p, use("model", required=True, note="here only a local folder saved by mirrorbert"))
    p.add_argument("--repo", required=True, help="the Hub repository: USER/NAME or ORG/NAME")
    p.add_argument("--private", action="store_true",
                   help="create the repository private (an existing repository keeps its visibility)")
    p.add_argument("--commit-message", default=DEFAULT_COMMIT_MESSAGE,
                   help=f"the message of the Hub commit; by default {DEFAULT_COMMIT_MESSAGE!r}")
    p.add_argument("--dry-run", action="store_true",
                   help="touch no network: write exactly the files that would be uploaded to --output and print "
                        "the record")
    options.add(p, use("output", note="with --dry-run: a folder of the files that would be uploaded"),
                use("overwrite", note="with --dry-run"))
    p.set_defaults(func=run_push)


def run_push(args) -> int:
    from mirrorbert.publish import hub

    repo = hub.check_repo_id(args.repo, "--repo")
    if args.dry_run and not args.output:
        raise UserError("--dry-run: needs --output DIR, the folder to write the files that would be uploaded to")
    if args.output and not args.dry_run:
        raise UserError(f"--output {args.output}: only with --dry-run (a push writes nothing locally)")
    if args.dry_run:
        record = hub.dry_run(args.model, repo, args.output, overwrite=bool(args.overwrite))
    else:
        record = hub.push_folder(args.model, repo, private=True if args.private else None,
                                 commit_message=args.commit_message)
        print(f"pushed {len(record['files'])} files ({record['bytes']} bytes) to {record['url']}", file=sys.stderr)
    print(jsonio.dumps(record, indent=2))
    return 0


# ----------------------------------------------------------------------------- train --push-to-hub
def check_push_to_hub(repo: str | None) -> str | None:
    """`train --push-to-hub`: the repo id, checked before any data is read or model loaded."""
    if repo is None:
        return None
    from mirrorbert.publish.hub import check_repo_id

    return check_repo_id(repo, "--push-to-hub")


def push_trained(output, repo: str) -> dict:
    """Push a training run's saved --output folder; a failure names the repo and where the model is kept."""
    from mirrorbert.publish.hub import push_folder

    try:
        record = push_folder(output, repo, model_option="--output", repo_option="--push-to-hub")
    except UserError as exc:
        raise UserError(f"{exc}. The trained model is saved in {output}; push it later with "
                        f"`mirrorbert push --model {output} --repo {repo}`") from None
    print(f"pushed {len(record['files'])} files ({record['bytes']} bytes) to {record['url']}", file=sys.stderr)
    return record
