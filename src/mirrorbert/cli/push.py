"""`mirrorbert push`: upload a saved model folder to the Hugging Face Hub (or, with --dry-run, write what would
be uploaded), and `train --push-to-hub`. Never loads the model."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import mirrorbert.jsonio as jsonio
from mirrorbert.cli.options import command, options_from_args
from mirrorbert.errors import UserError
from mirrorbert.publish.hub import DEFAULT_COMMIT_MESSAGE
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options



@dataclass(kw_only=True)
class PushOptions(Options):
    """`mirrorbert push`'s options, in --help order (settings/fields.py). It never loads the model, so it has
    no --trust-remote-code."""

    model: str | None = option(None, shared="model", note="here only a local folder saved by mirrorbert",
                               required=True)
    repo: str | None = option(None, help="the Hub repository: USER/NAME or ORG/NAME", required=True)
    private: bool = option(False, help="create the repository private (an existing repository keeps its visibility)")
    commit_message: str = option(DEFAULT_COMMIT_MESSAGE, help="the message of the Hub commit")
    dry_run: bool = option(False, help="touch no network: write exactly the files that would be uploaded to --output "
                                       "and print the record")
    output: str | None = option(None, shared="output", note="with --dry-run: a folder of the files that would be "
                                                            "uploaded")
    overwrite: bool = option(False, shared="overwrite", note="with --dry-run")

    def rules(self) -> None:
        if self.dry_run and not self.output:
            raise UserError(f"{self.say('dry_run')}: needs {self.say('output')} DIR, the folder to write the files "
                            "that would be uploaded to")
        if self.output and not self.dry_run:
            raise UserError(f"{self.say('output', self.output)}: only with {self.say('dry_run')} (a push writes "
                            "nothing locally)")


def add_push_parser(sub) -> None:
    command(sub, "push", run_push, PushOptions,
            summary="upload a saved model folder to the Hugging Face Hub (model card included)",
            description="Upload a model folder saved by mirrorbert (`train --output`, Encoder.save) to a Hugging Face "
                        "Hub model repository, created when missing: weights, tokenizer, sentence-transformers files, "
                        "mirrorbert.json and the model card (rendered for the repo unless you edited it), without "
                        "mirrorbert's marker, lock and temporary files or checkpoints. Only regular files inside the "
                        "folder, each its only link, go up: a symlink, hard link, FIFO or device there is refused, "
                        "naming it. The login is huggingface_hub's (HF_TOKEN or `hf auth login`). Prints a JSON "
                        "record: repo, files, bytes, URL.")


def run_push(args) -> int:
    from mirrorbert.publish import hub

    opts = options_from_args(PushOptions, args)
    repo = hub.check_repo_id(opts.repo, "--repo")
    if opts.dry_run:
        record = hub.dry_run(opts.model, repo, opts.output, overwrite=opts.overwrite)
    else:
        record = hub.push_folder(opts.model, repo, private=True if opts.private else None,
                                 commit_message=opts.commit_message)
        print(f"pushed {len(record['files'])} files ({record['bytes']} bytes) to {record['url']}", file=sys.stderr)
    print(jsonio.dumps(record, indent=2))
    return 0


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
