"""`mirrorbert` command line: a thin layer that parses options, calls the library and reports errors.

This module builds the parser (one module per command; shared options from `options.py`) and runs a command.

User mistakes (`UserError`) print one line and exit with status 2; Ctrl-C or SIGTERM (preemption)
during training writes a checkpoint and exits with 130; SIGTERM before the first training step ends a
training command at once with one line, also 130 (training/signals.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from mirrorbert._version import __version__
from mirrorbert.errors import UserError
from mirrorbert.reporting.progress import progress_interval
from mirrorbert.reporting.timing import mark_main
from mirrorbert.cli import options
from mirrorbert.cli.encode import add_encode_parser
from mirrorbert.cli.eval import add_eval_parser
from mirrorbert.cli.export import add_export_parser
from mirrorbert.cli.gloss import add_finetune_sts_parser, add_gloss_parser, add_lexsub_parser
from mirrorbert.cli.pretrain_mlm import add_pretrain_parser
from mirrorbert.cli.push import add_push_parser
from mirrorbert.cli.reproduce import add_reproduce_parser
from mirrorbert.cli.search import add_index_parser, add_search_parser
from mirrorbert.cli.train import add_train_parser

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
# Commands that train: SIGTERM outside their training loop ends them with one line (training/signals.py).
TRAINING_COMMANDS = frozenset({"train", "pretrain-mlm", "gloss-pretrain"})


def _quiet_third_party() -> None:
    """Hub/transformers chatter (load reports, weight-loading bars) drowns our own progress output."""
    # Environment variables rather than an import: importing transformers here cost every command,
    # even a one-line validation error, seconds (transformers reads them when a command imports it).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # already imported (library use, tests): set it directly
        try:
            transformers = sys.modules["transformers"]
            transformers.utils.logging.set_verbosity_error()
            transformers.utils.logging.disable_progress_bar()
        except Exception:  # very old transformers: nothing to quieten
            pass
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    logging.getLogger("faiss").setLevel(logging.WARNING)  # "Loading faiss with AVX2 support." reads like an error


# ----------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mirrorbert",
        description="Mirror-BERT and GR-BERT: turn masked language models into word, phrase and sentence encoders.",
    )
    parser.add_argument("--version", action="version", version=f"mirrorbert {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_train_parser(sub)
    add_encode_parser(sub)
    add_search_parser(sub)
    add_index_parser(sub)
    add_export_parser(sub)
    add_push_parser(sub)
    add_eval_parser(sub)
    add_pretrain_parser(sub)
    add_gloss_parser(sub)
    add_lexsub_parser(sub)
    add_finetune_sts_parser(sub)
    add_reproduce_parser(sub)
    for name, subparser in sub.choices.items():
        _add_trust_remote_code(subparser, name)
        options.state_defaults(subparser)
    return parser


# Commands with a --model that never load it (push uploads the files as they are).
NO_MODEL_LOAD = ("push",)


def _add_trust_remote_code(parser: argparse.ArgumentParser, command: str) -> None:
    """--trust-remote-code, last, for every command that loads a model (model_loading.py); a trainer has it
    already, as a field of its config."""
    flags = {flag for action in parser._actions for flag in action.option_strings}
    if command in NO_MODEL_LOAD or "--model" not in flags or options.SPECS["trust_remote_code"].flag in flags:
        return
    options.add(parser, "trust_remote_code")


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return None


def _stop_on_signal(command: str | None):
    """Training commands: SIGTERM outside the training loop ends them with one line (not a silent death)."""
    import contextlib

    if command not in TRAINING_COMMANDS:
        return contextlib.nullcontext()
    from mirrorbert.training.signals import stop_on_signal

    return stop_on_signal()


def _terminate_as_interrupt():
    """SIGTERM (`kill`, a scheduler) unwinds like Ctrl-C, so every write's `finally` removes its temporaries
    (training installs its own handler, which checkpoints first). Returns [the previous handler], or [] off the
    main thread (an embedding application's handling is left alone)."""
    def on_terminate(signum, frame):
        raise KeyboardInterrupt

    try:
        return [signal.signal(signal.SIGTERM, on_terminate)]
    except ValueError:
        return []


def main(argv: list[str] | None = None) -> int:
    mark_main()  # start-up time (process start to here), for the phase timings of `train`
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # blame the subcommand, with its own usage line, not the top-level parser
        sub = _subparser(parser, getattr(args, "command", None))
        (sub or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER_ERROR
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not args.verbose:  # third-party chatter only with -v
        _quiet_third_party()
    finished = False
    previous_term = _terminate_as_interrupt()
    try:
        progress_interval()  # a bad MIRRORBERT_PROGRESS_INTERVAL is one line now, not after the model loaded
        with _stop_on_signal(getattr(args, "command", None)):
            status = int(args.func(args) or 0)
        finished = True
        return status
    except UserError as exc:
        print(f"mirrorbert: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except PermissionError as exc:  # an unreadable input or unwritable output anywhere: name the file
        print(f"mirrorbert: error: {exc.filename or exc}: permission denied", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:
        from mirrorbert.safeguards.writes import WRITE_ERRNOS

        if exc.errno not in WRITE_ERRNOS:
            raise
        # a full disk (or quota, read-only filesystem, name too long) where no writer named its output
        print(f"mirrorbert: error: {exc.filename or 'a file being written'}: {WRITE_ERRNOS[exc.errno]}; free some "
              f"space or choose another location", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("mirrorbert: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:
        from mirrorbert.safeguards.preflight import is_tokenizer_panic

        if is_tokenizer_panic(exc):  # a crafted tokenizer.json that passed the probes fails on some input
            print(f"mirrorbert: error: the model's tokenizer failed on an input ({str(exc).splitlines()[0][:160] if str(exc) else 'a panic in tokenizers'}); "
                  "its tokenizer.json is damaged or crafted", file=sys.stderr)
            return EXIT_USER_ERROR
        signals = sys.modules.get("mirrorbert.training.signals")  # imported by training commands only
        if signals is None or not isinstance(exc, signals.SignalStop):
            raise
        print(f"mirrorbert: stopped by {exc} before the first training step (loading the model or data): "
              "nothing to checkpoint; run the same command again", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for handler in previous_term:
            signal.signal(signal.SIGTERM, handler if handler is not None else signal.SIG_DFL)
        if "mirrorbert.runtime.distributed" in sys.modules:  # a torchrun/accelerate job: leave its process group
            sys.modules["mirrorbert.runtime.distributed"].shutdown(synchronize=finished)


if __name__ == "__main__":
    sys.exit(main())
