"""`mirrorbert` command line: a thin layer that parses options, calls the library and reports errors.

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
from pathlib import Path

from mirrorbert import jsonio
from mirrorbert import __version__
from mirrorbert.config import PACKING_MODES
from mirrorbert.errors import UserError
from mirrorbert.phases import mark_main, pending_phase
from mirrorbert.evaluation.command import add_eval_parser
from mirrorbert.gloss.command import add_finetune_sts_parser, add_gloss_parser, add_lexsub_parser
from mirrorbert.mlm.command import add_pretrain_parser
from mirrorbert.reproduce.command import add_reproduce_parser
from mirrorbert.safety import WritePlan, atomic_output_file, check_outputs_avoid
from mirrorbert.search_command import add_index_parser, add_search_parser
from mirrorbert.export_command import add_export_parser
from mirrorbert.hub_command import PUSH_TO_HUB_HELP, add_push_parser, check_push_to_hub, push_trained

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
# Commands that train: SIGTERM outside their training loop ends them with one line (training/signals.py).
TRAINING_COMMANDS = frozenset({"train", "pretrain-mlm", "gloss-pretrain"})
PACKING_HELP = ("auto | on | grouped | off: how a batch avoids padding. on: several strings per row with "
                "block-diagonal attention (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT); grouped: strings sorted by "
                "length and run in small padded groups (any model, least memory); off: padded to the batch's longest. "
                "Default auto: packed rows where the model supports them and they cost fewer FLOPs than padding "
                "(random training batches; encode's length-sorted batches stay padded), length groups for "
                "models that cannot be packed")


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


# ----------------------------------------------------------------------------- train
def add_train_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="Mirror-BERT tuning of a masked LM into an encoder",
        description="Mirror-BERT: self-supervised contrastive tuning with duplicated views, span masking "
                    "and dropout. Options default to the chosen --preset (the paper's settings).",
    )
    g = p.add_argument_group("model and output")
    g.add_argument("--model", help="hub id or local folder of the starting MLM (default: bert-base-uncased)")
    g.add_argument("--output", help="folder to write the trained model to (must not exist unless --overwrite)")
    g.add_argument("--overwrite", action="store_true", default=None, help="replace an existing --output folder")
    g.add_argument("--push-to-hub", metavar="USER/NAME", help=PUSH_TO_HUB_HELP)
    g.add_argument("--preset", help="paper settings: word | phrase | sentence")
    g.add_argument("--config", dest="config_file", help="YAML or JSON file of options; command-line options win")
    d = p.add_argument_group("training strings")
    d.add_argument("--data", help="strings: .txt (one per line), .csv/.tsv/.parquet/.arrow or a saved datasets folder (with --column), .jsonl (with --field)")
    d.add_argument("--column", help="column holding the text in a CSV/TSV/Parquet/Arrow file or saved dataset")
    d.add_argument("--field", help="field holding the text in a JSONL file")
    d.add_argument("--words-top", type=int, help="train on the N most frequent words of --lang (wordfreq)")
    d.add_argument("--lang", help="language of --words-top (default en)")
    d.add_argument("--random-strings", type=int, help="train on N random letter/digit strings (zero-semantics control)")
    d.add_argument("--limit", type=int, help="use a random sample of N strings (seeded)")
    d.add_argument("--skip-bad-lines", action="store_true", default=None, help="skip lines that are not UTF-8 instead of stopping")
    m = p.add_argument_group("method")
    m.add_argument("--temperature", type=float, help="InfoNCE temperature tau (default 0.04; word preset 0.2)")
    m.add_argument("--loss", help="infonce (default, paper eq. 1) | ms (multi-similarity loss with online triplet "
                                  "mining, as SapBERT)")
    m.add_argument("--mask-span", type=int, help="mask a span of K units (--mask-unit) in the second view (0: off; default 0, presets: phrase 2, sentence 5)")
    m.add_argument("--mask-unit", help="char (default, the authors' code: K characters become one mask token) | "
                                       "token (our variant: K tokens become K mask tokens)")
    m.add_argument("--mask-min-chars", type=int, help="char unit: strings of N characters or fewer stay unmasked (default 30)")
    m.add_argument("--dropout", type=float, help="dropout probability (hidden, attention, embeddings)")
    m.add_argument("--drophead", type=float, help="probability of dropping a whole attention head per example")
    m.add_argument("--controlled-dropout", action="store_true", default=None, help="identical dropout masks for both views (ablation)")
    m.add_argument("--pooling", help="cls | mean | first-last")
    m.add_argument("--max-length", type=int, help="maximum tokens per string during training")
    o = p.add_argument_group("optimisation")
    o.add_argument("--lr", type=float, help="AdamW learning rate (default 2e-5)")
    o.add_argument("--weight-decay", type=float, help="AdamW weight decay (default 0.01)")
    o.add_argument("--schedule", help="constant (paper) | linear (decay to 0 after warmup)")
    o.add_argument("--warmup-steps", type=int, help="linear warmup steps (default 0)")
    o.add_argument("--max-grad-norm", type=float, help="clip gradients to this norm (default: off)")
    o.add_argument("--batch-size", type=int, help="strings per batch, 2 views each (default 200)")
    o.add_argument("--epochs", type=int, help="passes over the data")
    o.add_argument("--steps", type=int, help="stop after N optimiser steps (overrides --epochs)")
    o.add_argument("--seed", type=int, help="random seed (default 42)")
    h = p.add_argument_group("hardware and bookkeeping")
    h.add_argument("--device", help="auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:1 | mps")
    h.add_argument("--precision", help="auto (default: bf16 where native, i.e. Ampere+ GPUs and CPUs with "
                   "AVX512-BF16/AMX; fp16 on older GPUs; else fp32) | fp32 | bf16 | fp16 (GPU only)")
    h.add_argument("--packing", help=PACKING_HELP)
    h.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice, usually all cores)")
    h.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the model (default: off; falls back to eager with a warning if it fails)")
    h.add_argument("--gradient-checkpointing", action="store_true", default=None,
                   help="recompute activations in backward: less memory, ~30%% more time (default: off)")
    h.add_argument("--grad-cache-chunk", type=int,
                   help="GradCache: run the encoder N views at a time with cached embedding gradients, so "
                        "big batches fit in small memory with every in-batch negative kept (default 0: off)")
    h.add_argument("--save-every", type=int, help="write a checkpoint every N steps (0: only at the end/interrupt)")
    h.add_argument("--checkpoint-dir", help="where checkpoints go (default: <output>.checkpoints)")
    h.add_argument("--keep-checkpoints", type=int, help="how many checkpoints to keep (default 2)")
    h.add_argument("--resume", help="continue from a checkpoint folder (step-N) or a checkpoint root")
    h.add_argument("--log-dir", help="write TensorBoard scalars here")
    h.add_argument("--log-every", type=int, help="log metrics every N steps (default 10)")
    h.add_argument("--no-progress", dest="show_progress", action="store_false", default=None, help="no progress bar")
    e = p.add_argument_group("evaluation after training (model card)")
    e.add_argument("--eval-after", help="comma-separated eval tasks (e.g. sts,wordsim) run on the trained model before "
                                        "saving; scores go into mirrorbert.json and README.md (default: none)")
    e.add_argument("--data-dir", help="evaluation data for --eval-after (default: $MIRRORBERT_DATA)")
    p.set_defaults(func=run_train)


def _train_keys() -> tuple[str, ...]:
    """Every TrainConfig field is a `train` option of the same name, so the CLI never lists them twice."""
    from mirrorbert.config import FIELD_NAMES

    return tuple(sorted(FIELD_NAMES))


def train_headline(cfg, n_strings: int) -> str:
    """One line a person reads before training starts (the whole configuration: -v and mirrorbert.json)."""
    mask = f"span {cfg.mask_span} {cfg.mask_unit}s" if cfg.mask_span else "no span masking"
    budget = f"{cfg.steps} steps" if cfg.steps else f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}"
    return (f"training {cfg.model} on {n_strings} strings -> {cfg.output}\n"
            f"  {'preset ' + cfg.preset if cfg.preset else 'no preset'}: temperature {cfg.temperature:g}, {mask}, "
            f"dropout {cfg.dropout:g}, max length {cfg.max_length}, batch {cfg.batch_size} strings, "
            f"learning rate {cfg.lr:g}, {budget} (full configuration: -v, and mirrorbert.json)")


def train_summary(result) -> str:
    """What happened, labelled: steps, loss from first step to the last epoch's mean, collapse, scores."""
    info = result.info
    first = (info.get("collapse") or {}).get("first_loss")
    last = info.get("mean_loss_last_epoch")
    lines = [f"done: {result.steps} steps in {result.wall_time_s:.0f} s; training loss "
             + (f"{first:.4f} at the first step -> {last:.4f} (mean of the last epoch)" if first is not None
                and last is not None else f"{result.final_loss} (last step)")]
    collapse = info.get("collapse") or {}
    if "mean_pairwise_cosine" in collapse:
        lines.append(f"  mean pairwise cosine of {collapse['sample']} training strings: "
                     f"{collapse['mean_pairwise_cosine']:.3f}" + (" (collapsed)" if collapse.get("collapsed") else ""))
    scores = (info.get("eval_after") or {}).get("metrics") or {}
    for key, value in scores.items():
        if isinstance(value, (int, float)) and not key.endswith("_n"):
            lines.append(f"  after training, {key}: {100 * value:.2f} (x100)")
    lines.append(f"  model: {result.output}")
    return "\n".join(lines)


def run_train(args) -> int:
    from mirrorbert.config import resolve_config
    from mirrorbert.data import strings_for_config

    push_repo = check_push_to_hub(getattr(args, "push_to_hub", None))  # before anything is read or trained
    cfg = resolve_config({k: getattr(args, k, None) for k in _train_keys()}, config_file=args.config_file)
    if cfg.output:  # the outputs, before the data is read (the trainer checks again, and locks them)
        inputs = {"--config": args.config_file, "--model": cfg.model, "--data": cfg.data, "--data-dir": cfg.data_dir,
                  "--resume": cfg.resume}
        WritePlan(inputs, overwrite=bool(cfg.overwrite)).folder("--output", cfg.output) \
            .append_folder("--log-dir", cfg.log_dir).check()
        check_outputs_avoid({"--config": args.config_file}, ("--checkpoint-dir", cfg.resolved_checkpoint_dir()))
    with pending_phase("data"):  # the trainer's phase timings take this over
        strings = strings_for_config(cfg)  # data mistakes surface before torch is even imported
    with pending_phase("import"):  # torch and the trainer's modules
        from mirrorbert.distributed import launched_rank
        from mirrorbert.trainer import train

    main_rank = launched_rank() == 0  # under torchrun/accelerate only rank 0 speaks
    if main_rank:
        logging.getLogger("mirrorbert").debug("resolved configuration:\n%s", jsonio.dumps(cfg.to_dict(), indent=2))
        print(train_headline(cfg, len(strings.strings)), file=sys.stderr)
    result = train(cfg, strings)
    if result.interrupted:  # every process of an interrupted job names the checkpoint that rank 0 wrote
        from mirrorbert.training.engine import stop_message

        print(stop_message(result.stop_signal, result.steps, result.checkpoint, launched_rank()), file=sys.stderr)
        return EXIT_INTERRUPTED
    if not main_rank:
        return 0
    print(train_summary(result), file=sys.stderr)
    pushed = push_trained(result.output, push_repo) if push_repo else None
    print(jsonio.dumps({"output": str(result.output), "steps": result.steps, "final_loss": result.final_loss,
                      "mean_loss_last_epoch": result.info.get("mean_loss_last_epoch"),
                      "wall_time_s": round(result.wall_time_s, 2),
                      "strings_per_s": result.info.get("strings_per_s"),
                      **({"pushed": pushed["url"]} if pushed else {})}, indent=2))
    return 0


# ----------------------------------------------------------------------------- encode
def add_encode_parser(sub) -> None:
    p = sub.add_parser("encode", help="encode strings into a .npy matrix (one row per input line)")
    p.add_argument("--model", required=True, help="trained folder, sentence-transformers folder, HF MLM or hub id")
    p.add_argument("--input", required=True, help=".txt (one string per line), .csv/.tsv/.parquet/.arrow/saved datasets folder (--column) or .jsonl (--field)")
    p.add_argument("--column", help="column holding the text in a CSV/TSV/Parquet/Arrow file or saved dataset")
    p.add_argument("--field", help="field holding the text in a JSONL file")
    p.add_argument("--output", required=True, help="where to write the vectors (.npy)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    p.add_argument("--pooling", help="override the saved pooling: cls | mean | first-last")
    p.add_argument("--batch-size", type=int, default=64, help="strings per forward pass")
    p.add_argument("--max-length", type=int, help="truncate inputs to N tokens (default: the model's)")
    p.add_argument("--normalize", action="store_true", help="L2-normalise the vectors")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:1 | mps")
    p.add_argument("--precision", default="fp32", help="fp32 | bf16 | fp16 (GPU only)")
    p.add_argument("--packing", default="auto", choices=PACKING_MODES, help=PACKING_HELP)
    p.add_argument("--quantize", default="float32",
                   help="float32 (default) | int8 | uint8 (per-dimension ranges from these vectors) | binary | "
                        "ubinary (sign bits, 8 dimensions per byte): sentence-transformers' quantize_embeddings")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip lines that are not UTF-8; then row i of --output is no longer line i, so the line "
                        "numbers of the rows go to OUTPUT.rows.json (0-based, as search ids) with the skipped lines")
    p.add_argument("--no-progress", dest="show_progress", action="store_false", default=True, help="no progress bar")
    p.set_defaults(func=run_encode)


def rows_file(output: Path) -> Path:
    """Where `encode --skip-bad-lines` writes which input line each row is (beside the .npy)."""
    return output.with_name(output.stem + ".rows.json")


def run_encode(args) -> int:
    import numpy as np

    from mirrorbert.command_options import EncodeOptions
    from mirrorbert.training.device import check_device_and_precision

    from mirrorbert.distributed import launched_world_size

    opts = EncodeOptions.from_args(args)  # every value checked here, as in Python
    output = Path(opts.output)

    check_device_and_precision(opts.device, opts.precision)
    if opts.quantize != "float32":
        from mirrorbert.quantized import st_quantization

        st_quantization()  # installed, before the model loads
    plan = WritePlan({"--input": opts.input, "--model": opts.model}, overwrite=opts.overwrite).file("--output", output)
    if opts.skip_bad_lines:
        plan.file("--output", rows_file(output))
    with plan.locked():
        if opts.quantize == "float32" and launched_world_size() == 1:  # vectors straight to disk, chunk by chunk
            n_rows, dim, pooling, rows = _encode_streaming(opts, output)
            dtype = "float32"
        else:  # quantised (ranges from all vectors) or sharded over torchrun processes: in memory
            vectors, pooling, rows = _encode(opts)
            if vectors is None:
                return 0
            n_rows, dim = int(vectors.shape[0]), int(vectors.shape[1])
            if opts.quantize != "float32":
                from mirrorbert.quantized import quantize

                vectors = quantize(vectors, opts.quantize)
            with atomic_output_file(output, overwrite=opts.overwrite) as tmp:
                np.save(tmp, vectors)
            dtype = str(vectors.dtype)
        record = {"output": str(output), "rows": n_rows, "dim": dim, "pooling": pooling,
                  "dtype": dtype, "quantize": opts.quantize}
        if opts.skip_bad_lines:
            skipped, ids = (rows.skipped, rows.ids) if rows is not None else ([], list(range(n_rows)))
            with atomic_output_file(rows_file(output), overwrite=opts.overwrite) as tmp:
                Path(tmp).write_text(jsonio.dumps({
                    "input": str(opts.input), "output": str(output), "skipped_lines": skipped,
                    "row_ids": ids,
                    "row_ids_note": "row i of the matrix is record row_ids[i] of the input (0-based, as search ids); "
                                    "skipped_lines are 1-based line numbers",
                }) + "\n", encoding="utf-8")
            record.update(skipped_lines=len(skipped), rows_file=str(rows_file(output)))
    print(jsonio.dumps(record))
    return 0


def _encode_streaming(opts, output: Path):
    """One process: --input in chunks, the vectors written into OUTPUT's temporary .npy as they come
    (streaming.py); (rows, dim, pooling, the rows read when the input was read whole)."""
    from mirrorbert.encoder import Encoder
    from mirrorbert.packing import packing_flag
    from mirrorbert.streaming import chunked_input, encode_to_npy

    source = chunked_input(opts.input, opts.column, opts.field, opts.skip_bad_lines)  # before the model loads
    encoder = Encoder.load(opts.model, pooling=opts.pooling, device=opts.device, max_length=opts.max_length,
                           trust_remote_code=opts.trust_remote_code, cli=True)

    def encode(chunk: list[str]):
        return encoder.encode(chunk, batch_size=opts.batch_size, normalize=opts.normalize or None,
                              precision=opts.precision, packing=packing_flag(opts.packing))

    with atomic_output_file(output, overwrite=opts.overwrite) as tmp:
        rows = encode_to_npy(encode, source, encoder.dim, Path(tmp), show_progress=opts.show_progress, target=output)
    return rows, encoder.dim, encoder.pooling, source.rows


def _encode(opts):
    """The vectors of --input (None on the other processes of a torchrun job), the pooling used and the rows read."""
    from mirrorbert.data import read_rows
    from mirrorbert.distributed import init_from_env, sharded_encoding
    from mirrorbert.encoder import Encoder
    from mirrorbert.packing import packing_flag

    rows = read_rows(opts.input, column=opts.column, field=opts.field, skip_bad_lines=opts.skip_bad_lines,
                     option="--input")
    texts = rows.texts
    if not any(t.strip() for t in texts):
        raise UserError(f"--input {opts.input}: no text in the file (every line is blank)")
    dist_ctx = init_from_env(opts.device)  # under torchrun every process encodes a share of the rows
    encoder = Encoder.load(opts.model, pooling=opts.pooling, device=str(dist_ctx.device), max_length=opts.max_length,
                           trust_remote_code=opts.trust_remote_code, cli=True)
    with sharded_encoding(dist_ctx):
        vectors = encoder.encode(texts, batch_size=opts.batch_size, normalize=opts.normalize or None,
                                 show_progress=opts.show_progress and dist_ctx.is_main, precision=opts.precision,
                                 packing=packing_flag(opts.packing))
    return (vectors if dist_ctx.is_main else None), encoder.pooling, rows


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
        _state_defaults(subparser, _train_defaults() if name == "train" else None)
    return parser


# Commands with a --model that never load it (push uploads the files as they are).
NO_MODEL_LOAD = ("push",)


def _add_trust_remote_code(parser: argparse.ArgumentParser, command: str) -> None:
    """--trust-remote-code, defined once here for every command that loads a model (model_loading.py)."""
    from mirrorbert.model_loading import TRUST_HELP, TRUST_OPTION

    if command in NO_MODEL_LOAD or not any("--model" in a.option_strings for a in parser._actions):
        return
    parser.add_argument(TRUST_OPTION, dest="trust_remote_code", action="store_true",
                        default=None if command == "train" else False, help=TRUST_HELP)


# Options whose value comes from --preset when one is given.
PRESET_KEYS = ("temperature", "mask_span", "epochs", "max_length", "pooling")


def _train_defaults() -> dict:
    from dataclasses import fields

    from mirrorbert.config import TrainConfig

    return {f.name: f.default for f in fields(TrainConfig)}


def _state_defaults(parser: argparse.ArgumentParser, defaults: dict | None) -> None:
    """Append "(default: X)" to every option's help that does not state its default yet.

    `train` keeps argparse defaults at None (to tell "not given" from "given"), so its defaults come
    from TrainConfig instead.
    """
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS) or action.dest == "help":
            continue
        if "default" in action.help.lower() or action.required:
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)) or action.nargs == 0:
            text = "off"
        else:
            value = defaults.get(action.dest, action.default) if defaults is not None else action.default
            text = "none" if value is None or value == [] else str(value)
            if defaults is not None and action.dest in PRESET_KEYS:
                text += "; --preset sets its own"
        action.help = f"{action.help} (default: {text.replace('%', '%%')})"


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
        from mirrorbert.safety import WRITE_ERRNOS

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
        signals = sys.modules.get("mirrorbert.training.signals")  # imported by training commands only
        if signals is None or not isinstance(exc, signals.SignalStop):
            raise
        print(f"mirrorbert: stopped by {exc} before the first training step (loading the model or data): "
              "nothing to checkpoint; run the same command again", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for handler in previous_term:
            signal.signal(signal.SIGTERM, handler if handler is not None else signal.SIG_DFL)
        if "mirrorbert.distributed" in sys.modules:  # a torchrun/accelerate job: leave its process group
            sys.modules["mirrorbert.distributed"].shutdown(synchronize=finished)


if __name__ == "__main__":
    sys.exit(main())
