"""`mirrorbert reproduce`: the cells run end to end on a tiny model, the cache makes a rerun free, the
report has every table, and the paper-numbers file holds the paper's values."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from mirrorbert.errors import UserError
from mirrorbert.reproduce import ReproduceConfig, reproduce
from mirrorbert.reproduce import runner as runner_module
from mirrorbert.reproduce.cells import EXPERIMENTS, MIRROR_EXPERIMENTS
from mirrorbert.reproduce.paper import detect_base_model, load_paper_numbers, paper_value


def _head(src: Path, dst: Path, n: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, encoding="utf-8") as f:
        lines = [next(f, "") for _ in range(n)]
    dst.write_text("".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def tiny_data(shared_data, tmp_path_factory) -> Path:
    """A few lines of each shared set, in the shared layout (STS12-16, BC5CDR, most BLI pairs absent)."""
    root = tmp_path_factory.mktemp("data")
    heads = {
        "sts/STSBenchmark/sts-train.csv": 60, "sts/STSBenchmark/sts-dev.csv": 60, "sts/STSBenchmark/sts-test.csv": 80,
        "sts/SICK/SICK_test_annotated.txt": 80, "wordsim/multisimlex.tsv": 120, "qnli/dev.tsv": 80,
        "bel/ncbi/test_dictionary.txt": 300, "bel/ncbi/test_queries.txt": 40,
        "bli/en-fr/yacle.train.freq.5k.en-fr.tsv": 60, "bli/en-fr/yacle.test.freq.2k.en-fr.tsv": 30,
        "corpora/en_words_top_10k.txt": 300, "corpora/stsbenchmark_train_10k_sents_random_sampled.txt": 300,
    }
    for rel, n in heads.items():
        _head(shared_data / rel, root / rel, n)
    return root


def _config(model: Path, data: Path, out: Path, **kw) -> ReproduceConfig:
    kw.setdefault("experiments", list(MIRROR_EXPERIMENTS))
    kw.setdefault("eval_batch_size", 32)
    return ReproduceConfig(model=str(model), output=str(out), data_dir=str(data), quick=True, device="cpu", **kw)


@pytest.mark.slow  # ~25 s of CPU (every Mirror-BERT cell trains and evaluates twice), longer on a busy machine
def test_reproduce_quick_end_to_end_and_cache(tiny_bert, tiny_data, tmp_path, monkeypatch):
    from mirrorbert.evaluation import bli

    monkeypatch.setattr(bli, "frequent_words", lambda lang, n: [])  # keep the BLI cell fast and offline
    out = tmp_path / "run"
    lines: list[str] = []
    result = reproduce(_config(tiny_bert, tiny_data, out, seeds=(0, 1)), progress=lines.append)
    assert result.computed == len(result.results) > 20
    assert all(r.status == "ok" for r in result.results), [(r.cell, r.message) for r in result.results if r.status != "ok"]
    assert any("running" in line for line in lines) and any("est." in line for line in lines)

    report = (out / "report.md").read_text(encoding="utf-8")
    for exp in MIRROR_EXPERIMENTS:  # every table has its section
        assert EXPERIMENTS[exp][1] in report, exp
    assert "sts12" in report and "needs" in report  # STS12-16 absent here: listed as skipped with their files
    assert "qnli/after-stsb-sentences" in report  # no QNLI training sentences: says which data was used
    assert "not one of the paper's base models" in report  # a tiny model: ours only, no paper column
    assert (out / "plots" / "datasize.png").is_file() and (out / "plots" / "frequency.png").is_file()
    assert "isotropy_cosine.png" in report

    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    after = data["cells"]["sts/after"]
    assert after["seeds"] == [0, 1] and len(after["metrics"]["stsb"]["values"]) == 2
    assert after["metrics"]["stsb"]["std"] is not None
    assert "is_word" in data["cells"]["isotropy/no-aug/word"]["metrics"]
    assert "is_sentence" in data["cells"]["isotropy/after/sentence"]["metrics"]
    assert data["cells"]["sts/before"]["seeds"] == [None]  # the base model's evaluation does not depend on a seed
    assert {s["experiment"] for s in data["skipped"]} >= {"bli", "qnli"}

    # A rerun computes nothing: every cell comes from the cache.
    calls = []
    monkeypatch.setattr(runner_module, "compute_cell", lambda *a, **k: calls.append(a) or pytest.fail("recomputed"))
    again = reproduce(_config(tiny_bert, tiny_data, out, seeds=(0, 1)), progress=lambda _: None)
    assert calls == [] and again.computed == 0 and all(r.cached for r in again.results)

    # An interrupted run resumes: a lost cell file is the only thing computed.
    monkeypatch.undo()
    monkeypatch.setattr(bli, "frequent_words", lambda lang, n: [])
    (out / "cells" / "sts__after--s1.json").unlink()
    # --report-only computes nothing: the lost cell is listed as not run, the others come from the cache
    partial = reproduce(_config(tiny_bert, tiny_data, out, seeds=(0, 1), report_only=True), progress=lambda _: None)
    assert partial.computed == 0 and not (out / "cells" / "sts__after--s1.json").exists()
    assert [(r.cell, r.seed) for r in partial.results if r.status == "not run"] == [("sts/after", 1)]
    listed = json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"]["sts/after"]
    assert "no cached result (--report-only)" in listed["message"] and len(listed["metrics"]["stsb"]["values"]) == 1
    resumed = reproduce(_config(tiny_bert, tiny_data, out, seeds=(0, 1)), progress=lambda _: None)
    assert resumed.computed == 1

    # A copied (or moved) output folder keeps its cache, files derived into it included (BEL name samples).
    moved = tmp_path / "moved"
    shutil.copytree(out / "cells", moved / "cells")
    shutil.copy(out / ".mirrorbert-output", moved)  # the marker: a folder mirrorbert's reproduce wrote
    again = reproduce(_config(tiny_bert, tiny_data, moved, seeds=(0, 1), report_only=True), progress=lambda _: None)
    assert [r.cell for r in again.results if r.status == "not run"] == []
    # its report embeds only images that are in it: the cached cells' plots stayed in the first folder
    moved_report = (moved / "report.md").read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", moved_report)
    assert images and all((moved / image).is_file() for image in images), images
    assert "isotropy_cosine.png` is not in this folder" in moved_report


def test_reproduce_validates_options(tiny_bert, tiny_data, tmp_path):
    with pytest.raises(UserError, match="experiments='nope'"):  # Python names the argument
        reproduce(_config(tiny_bert, tiny_data, tmp_path, experiments=["nope"]))
    with pytest.raises(UserError, match="train_options="):
        reproduce(_config(tiny_bert, tiny_data, tmp_path, train_options={"no_such_option": 1}))
    with pytest.raises(UserError, match="gr_options=: unknown or runner-set option.*arch"):
        reproduce(_config(tiny_bert, tiny_data, tmp_path, gr_options={"arch": "sc"}))
    with pytest.raises(UserError, match="gr_options=: epochs=0: must be an integer >= 1"):
        reproduce(_config(tiny_bert, tiny_data, tmp_path, gr_options={"epochs": 0}))


def test_cli_reproduce_writes_report(tiny_bert, tiny_data, tmp_path, monkeypatch):
    from mirrorbert.cli.app import main

    # pretend the tiny model is bert-base-uncased: the report then sets each cell beside the paper's
    monkeypatch.setattr(runner_module, "detect_base_model", lambda model: "bert-base-uncased")
    out = tmp_path / "cli"
    rc = main(["reproduce", "--model", str(tiny_bert), "--data-dir", str(tiny_data), "--output", str(out),
               "--experiments", "sts,qnli", "--quick", "--device", "cpu", "--train-option", "lr=5e-5"])
    assert rc == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "--lr 5e-05" in report  # the override reaches the training command shown per cell
    assert "| cell | metric | ours | paper | Δ |" in report
    assert "| sts/before | stsb |" in report and "| 46.4 |" in report  # Table 3, BERT-mp STS-B: .464
    cells = json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"]
    stsb = cells["sts/before"]["metrics"]["stsb"]
    assert stsb["paper"] == pytest.approx(0.464) and stsb["delta"] == pytest.approx(stsb["mean"] - 0.464)
    assert main(["reproduce", "--model", str(tiny_bert), "--data-dir", str(tiny_data), "--output", str(out),
                 "--seeds", "a,b"]) == 2


def test_paper_numbers_file_has_the_papers_values():
    doc = load_paper_numbers()
    assert doc["sources"] and doc["unverified"]
    for cell in doc["cells"].values():
        assert cell.table and cell.source in doc["sources"] and 0 <= cell.value <= 1
    # Table 3 (STS): BERT-mp before, + Mirror after; RoBERTa + Mirror average
    assert paper_value("sts", "bert-base-uncased", "before", "avg").value == pytest.approx(0.493)
    assert paper_value("sts", "bert-base-uncased", "after", "stsb").value == pytest.approx(0.764)
    assert paper_value("sts", "roberta-base", "after", "avg").value == pytest.approx(0.753)
    # Table 1 (Multi-SimLex en) and Table 10 (random strings)
    assert paper_value("wordsim", "bert-base-uncased", "after", "msimlex_en").value == pytest.approx(0.556)
    assert paper_value("random-strings", "bert-base-uncased", "random-strings", "msimlex_en").value == pytest.approx(0.393)
    # Table 2 (BEL, PubMedBERT + Mirror, NCBI acc@1), Table 8 (controlled dropout), Table 9 (isotropy)
    assert paper_value("bel", "pubmedbert", "after", "ncbi_acc@1").value == pytest.approx(0.909)
    assert paper_value("ablation", "roberta-base", "controlled-dropout-no-span-mask", "sts12").value == pytest.approx(0.452)
    assert paper_value("isotropy", "bert-base-uncased", "after", "is_word").value == pytest.approx(0.599)
    assert paper_value("sts", None, "after", "avg") is None


def test_detect_base_model(tmp_path, tiny_bert):
    def folder(name: str, **config) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
        return d

    assert detect_base_model("bert-base-uncased") == "bert-base-uncased"
    assert detect_base_model("FacebookAI/roberta-base") == "roberta-base"
    assert detect_base_model("google-bert/bert-base-multilingual-cased") == "mbert"
    assert detect_base_model(str(folder("pm", _name_or_path="microsoft/BiomedNLP-PubMedBERT-base-uncased-abstract",
                                        num_hidden_layers=12, hidden_size=768))) == "pubmedbert"
    # a small model named after the tokenizer it borrows is not the paper's model
    assert detect_base_model(str(folder("mini-bert-base-uncased", num_hidden_layers=4, hidden_size=256))) is None
    assert detect_base_model(str(tiny_bert)) is None


@pytest.mark.slow  # ~40 s of CPU: two GR-BERT gloss pre-trainings, lexical substitution, three STS-B fine-tunings
def test_reproduce_grbert_quick_end_to_end(tiny_bert, tiny_data, shared_data, tmp_path):
    """--paper grbert: base MLM vs GR-MT vs GR-SC in every table; --gr-option reaches the pre-training."""
    data = tmp_path / "data"
    data.mkdir()
    for entry in tiny_data.iterdir():
        (data / entry.name).symlink_to(entry)
    for name in ("lexsub", "wordnet"):  # read-only sets: the quick limits keep them cheap
        (data / name).symlink_to(shared_data / name)
    out = tmp_path / "gr"
    cfg = _config(tiny_bert, data, out, experiments=None, paper="grbert", gr_options={"lr": 1e-4})
    result = reproduce(cfg, progress=lambda _: None)
    assert all(r.status == "ok" for r in result.results), [(r.cell, r.message) for r in result.results if r.status != "ok"]
    cells = {r.cell for r in result.results}
    for arch in ("base", "gr-mt", "gr-sc"):
        assert f"gr-sts/{arch}" in cells and f"gr-supervised/{arch}" in cells
        assert {f"lexsub/{arch}/none/LS07", f"lexsub/{arch}/none/LS14"} <= cells
    lexsub = [r.cell for r in result.results if r.experiment == "lexsub"]  # cheap tables first, whole columns
    assert lexsub[:3] == ["lexsub/base/none/LS07", "lexsub/gr-mt/none/LS07", "lexsub/gr-sc/none/LS07"]
    assert lexsub[-1] == "lexsub/gr-sc/emb+valid/LS14"
    report = (out / "report.md").read_text(encoding="utf-8")
    for exp in ("lexsub", "gr-sts", "gr-supervised"):
        assert EXPERIMENTS[exp][1] in report, exp
    assert "mirrorbert gloss-pretrain" in report and "--lr 0.0001" in report
    metrics = json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"]["lexsub/gr-mt/none/LS07"]["metrics"]
    assert {"best_p", "oot_p", "p_at_1"} <= set(metrics)
    again = reproduce(cfg, progress=lambda _: None)
    assert again.computed == 0


@pytest.mark.parametrize("option, message", [
    ("epochs", "--gr-option: expected KEY=VALUE, e.g. lr=5e-5, not 'epochs'"),
    ("arch=sc", "--gr-option: unknown or runner-set option(s) arch"),
    ("epochs=0", "--gr-option: --epochs 0: must be an integer >= 1"),
])
def test_cli_bad_gr_option_is_one_line_before_any_work(tiny_bert, tiny_data, tmp_path, capsys, option, message):
    from mirrorbert.cli.app import main

    rc = main(["reproduce", "--model", str(tiny_bert), "--data-dir", str(tiny_data), "--output", str(tmp_path / "out"),
               "--paper", "grbert", "--gr-option", option])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("mirrorbert: error: ") and message in err[0], err
    assert not (tmp_path / "out" / "cells").exists()  # refused before any cell ran


# ----------------------------------------------------------------------------- refuse early, retry failures
def _fake_compute(fail: set[str] = frozenset()):
    """compute_cell without the work: a fixed metric, or an out-of-memory error for the cells in `fail`."""
    def compute(ctx, cell, seed):
        if cell.id in fail:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return runner_module.CellResult(cell.id, cell.experiment, cell.state, seed, "", {"stsb": 0.5}, wall_s=0.01)
    return compute


def test_reproduce_empty_model_folder_is_refused_before_any_cell(tiny_data, tmp_path, monkeypatch, capsys):
    from mirrorbert.cli.app import main

    monkeypatch.setattr(runner_module, "compute_cell", lambda *a: pytest.fail("a cell ran"))
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(UserError, match="--model .*config.json"):
        reproduce(_config(empty, tiny_data, tmp_path / "out", experiments=["sts"]))
    rc = main(["reproduce", "--model", str(empty), "--data-dir", str(tiny_data), "--output", str(tmp_path / "o2"),
               "--experiments", "sts", "--quick"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("mirrorbert: error: --model"), err
    assert not (tmp_path / "out").exists() and not (tmp_path / "o2").exists()  # nothing written


@pytest.mark.parametrize("kw, message", [
    ({"train_options": {"lr": "abc"}}, r"train_options=: .*lr"),
    ({"train_options": {"lr": -1.0}}, r"train_options=: lr=-1.0: outside \(0, 1\]"),
    ({"train_options": {"max_length": 100000}}, r"cell sts/after: --max-length 100000"),
    ({"eval_batch_size": 0}, r"eval_batch_size=0: must be an integer >= 1"),
])
def test_reproduce_bad_options_refused_before_any_cell(tiny_bert, tiny_data, tmp_path, monkeypatch, kw, message):
    monkeypatch.setattr(runner_module, "compute_cell", lambda *a: pytest.fail("a cell ran"))
    with pytest.raises(UserError, match=message):
        reproduce(_config(tiny_bert, tiny_data, tmp_path / "out", experiments=["sts"], **kw))
    assert not (tmp_path / "out" / "cells").exists()


def test_reproduce_failed_cell_is_reported_not_cached_and_retried(tiny_bert, tiny_data, tmp_path, monkeypatch, capsys):
    from mirrorbert.cli.app import main

    out = tmp_path / "out"
    argv = ["reproduce", "--model", str(tiny_bert), "--data-dir", str(tiny_data), "--output", str(out),
            "--experiments", "sts", "--quick", "--device", "cpu"]
    monkeypatch.setattr(runner_module, "compute_cell", _fake_compute(fail={"sts/after"}))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "mirrorbert: error: cell sts/after seed 0 failed: RuntimeError: CUDA out of memory" in err
    assert not (out / "cells" / "sts__after--s0.json").exists()  # never cached as a result
    assert (out / "cells" / "sts__before--sx.json").is_file()
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Failed cells" in report and "**sts/after** seed 0: RuntimeError: CUDA out of memory" in report
    assert json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"]["sts/after"]["status"] == "error"

    # the next run retries the failed cell only; it now succeeds and the command exits 0
    calls: list[str] = []
    ok = _fake_compute()
    monkeypatch.setattr(runner_module, "compute_cell", lambda ctx, cell, seed: calls.append(cell.id) or ok(ctx, cell, seed))
    assert main(argv) == 0
    assert calls == ["sts/after"] and (out / "cells" / "sts__after--s0.json").is_file()


@pytest.mark.parametrize("damage", ["list", "null-metrics", "string-metric", "folder", "not-json"])
def test_reproduce_damaged_cache_file_is_set_aside_and_recomputed(tiny_bert, tiny_data, tmp_path, monkeypatch,
                                                                   caplog, damage):
    out = tmp_path / "out"
    cfg = _config(tiny_bert, tiny_data, out, experiments=["sts"])
    monkeypatch.setattr(runner_module, "compute_cell", _fake_compute())
    reproduce(cfg, progress=lambda _: None)
    cell = out / "cells" / "sts__before--sx.json"
    record = json.loads(cell.read_text(encoding="utf-8"))
    if damage == "folder":
        cell.unlink()
        (cell / "inner").mkdir(parents=True)
    else:
        text = {"list": "[]", "null-metrics": json.dumps({**record, "metrics": None}),
                "string-metric": json.dumps({**record, "metrics": {"stsb": "0.5"}}), "not-json": "{oops"}[damage]
        cell.write_text(text, encoding="utf-8")
    calls: list[str] = []
    ok = _fake_compute()
    monkeypatch.setattr(runner_module, "compute_cell", lambda ctx, c, seed: calls.append(c.id) or ok(ctx, c, seed))
    with caplog.at_level("WARNING", logger="mirrorbert.reproduce.runner"):
        again = reproduce(cfg, progress=lambda _: None)
    warnings = [r for r in caplog.records if "damaged cache" in r.getMessage()]
    assert len(warnings) == 1 and "sts__before--sx.json" in warnings[0].getMessage()
    assert calls == ["sts/before"] and again.computed == 1 and not again.failed
    assert cell.is_file() and json.loads(cell.read_text(encoding="utf-8"))["metrics"] == {"stsb": 0.5}
    (aside,) = cell.parent.glob("sts__before--sx.json.damaged-*")  # set aside, not deleted
    assert aside.name in warnings[0].getMessage()


# ----------------------------------------------------------------------------- time estimates
class _Recorder:
    """A real encoder that records what it is asked to encode."""

    def __init__(self, encoder):
        self.encoder, self.texts = encoder, []

    def encode(self, texts, *args, **kwargs):
        self.texts.extend(texts)
        return self.encoder.encode(texts, *args, **kwargs)


@pytest.mark.parametrize("task, options, reference", [
    ("sts", {}, False), ("wordsim", {"sets": ["multisimlex"], "languages": ["en"]}, False), ("qnli", {}, False),
    ("bel", {}, False), ("isotropy", {"max_texts": 40, "texts_file": "corpora/en_words_top_10k.txt"}, True),
])
def test_dry_run_counts_exactly_what_the_evaluation_encodes(tiny_bert, tiny_data, tmp_path, task, options, reference):
    """The estimate's work count is the evaluation's own: the same texts as a real run, in any order."""
    from mirrorbert.encoder.model import Encoder
    from mirrorbert.evaluation.runner import evaluate
    from mirrorbert.reproduce.estimate import dry_run

    if "texts_file" in options:
        options = {**options, "texts_file": str(tiny_data / options["texts_file"])}
    texts, other_s = dry_run(task, options, tiny_data, 16, reference)
    model, before = (_Recorder(Encoder.load(str(tiny_bert), pooling="mean", device="cpu")) for _ in range(2))
    evaluate(model, tasks=[task], data_dir=tiny_data, plot_dir=tmp_path / "plots", batch_size=16,
             task_options={task: options},
             reference_encoder=before if reference else None)
    assert texts and sorted(texts) == sorted(model.texts + before.texts) and other_s >= 0


def test_estimator_arithmetic_and_correction(monkeypatch):
    """est = steps x batch x 2 views x 3 passes x s/text + load and save; later cells are scaled by measured/predicted."""
    from types import SimpleNamespace

    from mirrorbert.reproduce import estimate

    est = estimate.Estimator(encoder=None, batch_size=8, load_s=0.5)
    monkeypatch.setattr(est, "_per_text", lambda texts: 0.01)
    strings = SimpleNamespace(strings=[f"s{i}" for i in range(100)])
    monkeypatch.setattr("mirrorbert.data.strings.strings_for_config", lambda cfg: strings)
    cfg = SimpleNamespace(data="x", words_top=None, random_strings=None, limit=None, column=None, max_length=32,
                          steps=None, epochs=2, batch_size=16)
    steps = 2 * 7  # two epochs of ceil(100 / 16) batches
    assert est.train_prediction(cfg) == pytest.approx(steps * 16 * 6 * 0.01 + 2 * 0.5)
    parts = [("train:word", 3.0), ("eval:sts", 2.0)]
    assert est.estimate([]) is None and est.estimate(parts) == pytest.approx(5.0)
    # measured: training twice as slow, evaluation twice as fast as predicted
    est.record([("train:word", 3.0, 6.0), ("eval:sts", 2.0, 1.0)])
    assert est.factor("train:word") == pytest.approx(2.0) and est.factor("eval:sts") == pytest.approx(0.5)
    assert est.estimate(parts) == pytest.approx(3.0 * 2 + 2.0 * 0.5)
    # a kind not seen yet takes its family's ratio; a kind seen takes its own
    assert est.factor("train:sentence") == pytest.approx(2.0)
    est.record([("train:sentence", 4.0, 4.0)])
    assert est.factor("train:sentence") == pytest.approx(1.0) and est.factor("train:word") == pytest.approx(2.0)
    assert est.factor("train:phrase") == pytest.approx((6.0 + 4.0) / (3.0 + 4.0))


def test_quick_data_dir_cuts_evaluation_files_and_links_the_rest(tiny_data, tmp_path):
    from mirrorbert.reproduce.cells import QuickLimits, quick_data_dir

    limits = QuickLimits(eval_lines=10, bel_names=30)
    quick = quick_data_dir(tiny_data, tmp_path / "q", limits)
    src = tiny_data / "sts/STSBenchmark/sts-test.csv"
    cut = (quick / "sts/STSBenchmark/sts-test.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    assert cut == src.read_text(encoding="utf-8").splitlines(keepends=True)[:10]
    assert len((quick / "bel/ncbi/test_dictionary.txt").read_text(encoding="utf-8").splitlines()) == 30
    assert (quick / "corpora").is_symlink() and (quick / "corpora").resolve() == (tiny_data / "corpora").resolve()
    before = (quick / "sts/STSBenchmark/sts-test.csv").stat().st_mtime_ns
    quick_data_dir(tiny_data, tmp_path / "q", limits)  # unchanged content is not rewritten: the cache stays valid
    assert (quick / "sts/STSBenchmark/sts-test.csv").stat().st_mtime_ns == before


def test_reproduce_retries_a_failure_cached_by_an_older_version(tiny_bert, tiny_data, tmp_path, monkeypatch):
    """Older versions cached failures as results; such a file is computed again, not reused."""
    out = tmp_path / "out"
    cfg = _config(tiny_bert, tiny_data, out, experiments=["sts"])
    monkeypatch.setattr(runner_module, "compute_cell", _fake_compute())
    reproduce(cfg, progress=lambda _: None)
    cell = out / "cells" / "sts__before--sx.json"
    record = json.loads(cell.read_text(encoding="utf-8"))
    cell.write_text(json.dumps({**record, "status": "error", "metrics": {}, "message": "CUDA out of memory"}),
                    encoding="utf-8")
    calls: list[str] = []
    ok = _fake_compute()
    monkeypatch.setattr(runner_module, "compute_cell", lambda ctx, c, seed: calls.append(c.id) or ok(ctx, c, seed))
    again = reproduce(cfg, progress=lambda _: None)
    assert calls == ["sts/before"] and not again.failed
    assert json.loads(cell.read_text(encoding="utf-8"))["status"] == "ok"
