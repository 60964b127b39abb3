"""`mirrorbert` command line: builds the parser (one module per command, each flag made from an options field by
`options.py`) and runs a command. A user mistake or a limit of the process or system is one line and exit 2;
Ctrl-C, SIGTERM or SIGHUP exit 130 (during training after a checkpoint: training/signals.py); a closed pipe 141.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from dataclasses import dataclass
import os
import sys

from mirrorbert._version import __version__
from mirrorbert.errors import UserError, first_line
from mirrorbert.reporting.heartbeat import beating, progress_interval
from mirrorbert.reporting.timing import mark_main
from mirrorbert.cli.options import Parser, add_options
from mirrorbert.cli.environment import check_environment, console_streams, silence_stdout
from mirrorbert.cli.encode import add_encode_parser
from mirrorbert.cli.eval import add_eval_parser
from mirrorbert.cli.export import add_export_parser
from mirrorbert.cli.gloss import add_finetune_sts_parser, add_gloss_parser, add_lexsub_parser
from mirrorbert.cli.pretrain_mlm import add_pretrain_parser
from mirrorbert.cli.push import add_push_parser
from mirrorbert.cli.reproduce import add_reproduce_parser
from mirrorbert.cli.search import add_index_parser, add_search_parser
from mirrorbert.cli.train import add_train_parser
from mirrorbert.settings.fields import option
from mirrorbert.settings.validation import Options
from mirrorbert.training.signals import TERMINATING, SignalStop, install, restore, stop_on_signal

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what the shell reports for a command whose reader went away
# Commands that train: SIGTERM outside their training loop ends them with one line (training/signals.py).
TRAINING_COMMANDS = frozenset({"train", "pretrain-mlm", "gloss-pretrain"})


def _quiet_third_party() -> None:
    """Hub/transformers chatter (load reports, weight-loading bars) drowns our own progress output; set through
    environment variables, so that no command imports transformers for it."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # already imported (library use, tests): set it directly
        sys.modules["transformers"].utils.logging.set_verbosity_error()
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    logging.getLogger("faiss").setLevel(logging.WARNING)  # "Loading faiss with AVX2 support." reads like an error


@dataclass(kw_only=True)
class AppOptions(Options):
    """The options before the command (`mirrorbert -v train ...`)."""

    verbose: bool = option(False, help="debug logging", aliases=("-v",))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mirrorbert", description="Mirror-BERT and GR-BERT: turn masked language models into word, "
                                                   "phrase and sentence encoders.", version=f"mirrorbert {__version__}")
    add_options(parser, AppOptions)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_command in (add_train_parser, add_encode_parser, add_search_parser, add_index_parser, add_export_parser,
                        add_push_parser, add_eval_parser, add_pretrain_parser, add_gloss_parser, add_lexsub_parser,
                        add_finetune_sts_parser, add_reproduce_parser):  # in --help order
        add_command(sub)
    return parser


def _on_terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    mark_main()  # start-up time (process start to here), for the phase timings of `train`
    try:
        check_environment()  # a deleted working folder, too few open files: before anything loads
        parser = build_parser()
        args = parser.parse_args(argv)
    except UserError as exc:  # or a mistyped option or value: one line naming the likely one (options.Parser)
        print(f"mirrorbert: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER_ERROR
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not args.verbose:  # third-party chatter only with -v
        _quiet_third_party()
    finished = False
    # SIGTERM and SIGHUP unwind like Ctrl-C, so every write's `finally` removes its temporaries and locks
    previous = install(TERMINATING, _on_terminate)
    try:
        with console_streams():
            progress_interval()  # a bad MIRRORBERT_PROGRESS_INTERVAL is one line now, not after the model loaded
            show = getattr(args, "show_progress", None) is not False  # --no-progress: no heartbeat (None: not given)
            stop = stop_on_signal() if args.command in TRAINING_COMMANDS else contextlib.nullcontext()
            with stop, beating(f"running {args.command}", show=show):
                status = int(args.func(args) or 0)
            sys.stdout.flush()  # a closed pipe is met here, not in the interpreter's last flush
        finished = True
        return status
    except BaseException as exc:
        status = _failure_status(exc)
        if status is None:
            raise
        return status
    finally:
        restore(previous)
        if "mirrorbert.runtime.distributed" in sys.modules:  # a torchrun/accelerate job: leave its process group
            sys.modules["mirrorbert.runtime.distributed"].shutdown(synchronize=finished)


def _failure_status(exc: BaseException) -> int | None:
    """The exit status of a command that raised `exc`, after its one line (a limit of the process or the system
    named as what it is); None for an error that is a bug (its traceback is shown)."""
    if isinstance(exc, BrokenPipeError):  # `mirrorbert search ... | head -1`: the reader has what it wanted
        silence_stdout()
        return EXIT_BROKEN_PIPE
    if isinstance(exc, KeyboardInterrupt):
        print("mirrorbert: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(exc, SignalStop):
        print(f"mirrorbert: stopped by {exc} before the first training step (loading the model or data): "
              "nothing to checkpoint; run the same command again", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(exc, UserError):
        line = str(exc)
    elif not isinstance(exc, Exception):
        return None
    else:
        from mirrorbert.encoder.source import is_tokenizer_panic
        from mirrorbert.safeguards.writes.failures import resource_failure

        line = resource_failure(exc)
        if line is None and is_tokenizer_panic(exc):  # a crafted tokenizer.json that passed the probes fails
            line = (f"the model's tokenizer failed on an input ({first_line(exc)[:160]}); its tokenizer.json is "
                    "damaged or crafted")
        if line is None:
            return None
    print(f"mirrorbert: error: {line}", file=sys.stderr)
    return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
