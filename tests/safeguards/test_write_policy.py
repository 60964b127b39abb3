"""The write policy: every command writes every path through `mirrorbert.safeguards.writes`. Each data-loss case
runs through the real CLI and shows that nothing was lost; every writing command refuses, before any model is
loaded, an output inside its input and an existing file or folder without --overwrite.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest

from mirrorbert.safeguards import writes as safety
from mirrorbert.safeguards.writes.markers import foreign_file
from mirrorbert.cli.app import main
from mirrorbert.errors import UserError
from support import one_error_line, snapshot


@pytest.fixture
def proj(tmp_path, monkeypatch, corpus, tiny_bert):
    """A user's project: cwd with a model copy `m/`, a data directory `data/` and strings; a private HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "proj"
    root.mkdir()
    (root / "sents.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    shutil.copytree(tiny_bert, root / "m")
    sts = root / "data" / "sts" / "STSBenchmark"
    sts.mkdir(parents=True)
    (sts / "sts-train.csv").write_text("genre\tfile\tyear\t1\t5.0\ta cat\ta cat\n", encoding="utf-8")
    monkeypatch.setenv("MIRRORBERT_DATA", str(root / "data"))
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def no_model_load(monkeypatch):
    """Any attempt to load a model or tokenizer fails the test: the check under test must come first."""
    import transformers

    import mirrorbert.encoder.model

    def trap(*args, **kwargs):
        raise AssertionError("a model was loaded before the error was found")

    monkeypatch.setattr(mirrorbert.encoder.model.Encoder, "load", trap)
    for name in ("AutoConfig", "AutoTokenizer", "AutoModel", "AutoModelForMaskedLM"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", trap)


def refused(capsys, argv: list[str], *fragments: str) -> str:
    assert main(argv) == 2
    return one_error_line(capsys, *fragments)


TRAIN = ["--data", "sents.txt", "--steps", "1", "--batch-size", "4", "--max-length", "16", "--no-progress",
         "--device", "cpu"]

# command -> (argv without the output, the output option, "file" or "folder")
COMMANDS = {
    "train": (["train", "--model", "m", *TRAIN], "--output", "folder"),
    "encode": (["encode", "--model", "m", "--input", "sents.txt"], "--output", "file"),
    "eval --output": (["eval", "--model", "m", "--tasks", "sts"], "--output", "file"),
    "eval --report": (["eval", "--model", "m", "--tasks", "sts"], "--report", "file"),
    "eval --plot-dir": (["eval", "--model", "m", "--tasks", "isotropy"], "--plot-dir", "folder"),
    "pretrain-mlm": (["pretrain-mlm", "--model", "m", "--corpus", "sents.txt", "--no-progress"], "--output", "folder"),
    "gloss-pretrain": (["gloss-pretrain", "--model", "m", "--no-progress"], "--output", "folder"),
    "gloss-pretrain --export-triplets": (["gloss-pretrain", "--model", "m", "--output", "gr", "--no-progress"],
                                         "--export-triplets", "file"),
    "lexsub": (["lexsub", "--model", "m"], "--output", "folder"),
    "finetune-sts": (["finetune-sts", "--model", "m"], "--output", "file"),
    "reproduce": (["reproduce", "--model", "m"], "--output", "folder"),
    "index": (["index", "--model", "m", "--corpus", "sents.txt"], "--output", "folder"),
    "push": (["push", "--model", "m", "--repo", "user/name", "--dry-run"], "--output", "folder"),
    "export": (["export", "--model", "m"], "--output", "folder"),
}


def _name(kind: str, base: str) -> str:
    return base + (".npy" if kind == "file" else "")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_writing_command_goes_through_the_policy(proj, capsys, no_model_load, command):
    argv, option, kind = COMMANDS[command]
    model = snapshot(proj / "m")
    name = "out.npy" if command == "encode" else ("out.json" if kind == "file" else "out")
    # inside an input (the model folder), even with --overwrite
    refused(capsys, [*argv, option, f"m/{name}", "--overwrite"], option, "lies inside the input --model")
    # the current directory, or a parent of an input
    refused(capsys, [*argv, option, "." if kind == "folder" else "..", "--overwrite"], option)
    # an existing file or folder of the user, without --overwrite
    user = proj / name
    if kind == "file":
        user.write_text("the user's file\n", encoding="utf-8")
    else:
        user.mkdir()
        (user / "notes.md").write_text("the user's notes\n", encoding="utf-8")
    refused(capsys, [*argv, option, name], option, "already exists; pass --overwrite")
    if kind == "folder":  # and with --overwrite, a folder mirrorbert did not write
        refused(capsys, [*argv, option, name, "--overwrite"], option, "mirrorbert wrote")
        assert (user / "notes.md").read_text(encoding="utf-8") == "the user's notes\n"
    else:
        assert user.read_text(encoding="utf-8") == "the user's file\n"
    assert snapshot(proj / "m") == model


def test_train_checks_its_outputs_before_reading_the_data(proj, capsys, no_model_load):
    (proj / "one.txt").write_text("just one string\n", encoding="utf-8")  # a data error, found later
    refused(capsys, ["train", "--model", "m", "--data", "one.txt", "--output", "m/out"], "lies inside the input --model")


def test_every_command_that_writes_has_overwrite_and_search_writes_nothing():
    from mirrorbert.cli.app import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    writes = {name for name, p in commands.items() if any("--output" in a.option_strings for a in p._actions)}
    assert writes == {c.split()[0] for c in COMMANDS}  # the parametrised test above covers every one
    for name in writes:
        assert any("--overwrite" in a.option_strings for a in commands[name]._actions), name
    assert not any(opt in a.option_strings for a in commands["search"]._actions for opt in ("--output", "--report"))


# --------------------------------------------------------------------------- case 1
def test_finetune_sts_keeps_existing_files(proj, capsys, no_model_load):
    (proj / "results.json").write_text("{}\n", encoding="utf-8")
    refused(capsys, ["finetune-sts", "--model", "m", "--output", "results.json"], "--output results.json",
            "already exists")
    assert (proj / "results.json").read_text(encoding="utf-8") == "{}\n"
    tokenizer = (proj / "m" / "tokenizer.json").read_bytes() if (proj / "m" / "tokenizer.json").exists() else None
    refused(capsys, ["finetune-sts", "--model", "m", "--output", "m/tokenizer.json", "--overwrite"],
            "lies inside the input --model")
    train = proj / "data" / "sts" / "STSBenchmark" / "sts-train.csv"
    before = train.read_bytes()
    refused(capsys, ["finetune-sts", "--model", "m", "--output", str(train), "--overwrite"],
            "lies inside the input --data-dir")
    assert train.read_bytes() == before
    if tokenizer is not None:
        assert (proj / "m" / "tokenizer.json").read_bytes() == tokenizer


def test_finetune_sts_replaces_with_overwrite_through_a_temporary_file(proj, monkeypatch):
    from mirrorbert.gloss import finetune_sts as ft

    run = ft.StsRun(fraction=1.0, seed=0, train_pairs=2, steps=1, test_spearman=50.0, wall_time_s=0.0)
    monkeypatch.setattr(ft, "finetune_once", lambda cfg, train, test, fraction, seed: run)
    monkeypatch.setattr("mirrorbert.evaluation.sts.load_set", lambda *a, **k: None)
    (proj / "r.json").write_text("old\n", encoding="utf-8")
    argv = ["finetune-sts", "--model", "m", "--seeds", "0", "--fractions", "1", "--output", "r.json"]
    assert main([*argv, "--overwrite"]) == 0
    assert json.loads((proj / "r.json").read_text(encoding="utf-8"))["results"]["1"]["mean"] == 50.0
    assert not [p for p in proj.iterdir() if p.name.startswith(".r")]  # no temporary or lock left


# --------------------------------------------------------------------------- cases 2, 3 and 5
def test_eval_never_writes_into_its_inputs(proj, capsys, no_model_load):
    data = snapshot(proj / "data")
    model = snapshot(proj / "m")
    for option in ("--output", "--report"):
        refused(capsys, ["eval", "--model", "m", "--tasks", "sts", option, "data/sts/STSBenchmark/sts-train.csv",
                         "--overwrite"], option, "lies inside the input --data-dir")
        refused(capsys, ["eval", "--model", "m", "--tasks", "sts", option, "m/config.json", "--overwrite"],
                option, "lies inside the input --model")
    refused(capsys, ["eval", "--model", "m", "--tasks", "isotropy", "--plot-dir", "m/plots"], "--plot-dir",
            "lies inside the input --model")
    refused(capsys, ["eval", "--model", "m", "--tasks", "isotropy", "--report", "m/r.md"], "--report",
            "lies inside the input --model")
    refused(capsys, ["eval", "--model", "m", "--tasks", "isotropy", "--report", "r.md", "--reference-model", "m",
                     "--plot-dir", "m"], "--plot-dir", "is the input --model")
    refused(capsys, ["eval", "--model", "m", "--tasks", "bel", "--option", "bel.predictions_path=m/p.jsonl"],
            "bel.predictions_path", "lies inside the input --model")
    assert snapshot(proj / "data") == data and snapshot(proj / "m") == model


def test_eval_outputs_may_not_clobber_each_other(proj, capsys, no_model_load):
    refused(capsys, ["eval", "--model", "m", "--tasks", "sts", "--output", "x", "--report", "x"],
            "--output x and --report x are the same path")
    refused(capsys, ["eval", "--model", "m", "--tasks", "sts", "--output", "r/a.json", "--plot-dir", "r"],
            "--output r/a.json and --plot-dir r overlap")
    refused(capsys, ["eval", "--model", "m", "--tasks", "sts", "--output", "r_files", "--report", "r.md"],
            "--output r_files and --report (its plot folder) r_files")


def test_lexsub_output_never_inside_the_model(proj, capsys, no_model_load):
    refused(capsys, ["lexsub", "--model", "m", "--output", "m"], "--output m", "is the input --model")
    refused(capsys, ["lexsub", "--model", "m", "--output", "m/ls", "--overwrite"], "lies inside the input --model")


class _Scores(dict):
    artifacts: dict[str, str]


def test_eval_plots_are_drawn_aside_marked_and_replaced_only_with_overwrite(proj, monkeypatch):
    from mirrorbert.evaluation import runner

    def plotting_task(encoder, root, plot_dir=None, **kwargs):
        path = Path(plot_dir) / "iso.png"
        path.write_bytes(b"png")
        scores = _Scores(primary=0.5)
        scores.artifacts = {"plot": str(path)}
        return scores

    monkeypatch.setattr(runner, "get_task", lambda name: plotting_task)
    result = runner.evaluate(object(), tasks="isotropy", data_dir=proj / "data", report=proj / "r.md")
    plots = proj / "r_files"
    assert result["isotropy"].artifacts == {"plot": str(plots / "iso.png")}  # the final folder, not the temporary
    assert (plots / "iso.png").read_bytes() == b"png"
    assert "r_files/iso.png" in (proj / "r.md").read_text(encoding="utf-8")
    assert safety.read_marker(plots)["files"] == ["iso.png"]
    with pytest.raises(UserError, match="already exists"):
        runner.evaluate(object(), tasks="isotropy", data_dir=proj / "data", report=proj / "r.md")
    runner.evaluate(object(), tasks="isotropy", data_dir=proj / "data", report=proj / "r.md", overwrite=True)
    (plots / "mine.png").write_bytes(b"the user's")
    with pytest.raises(UserError, match="mine.png, which mirrorbert did not write"):
        runner.evaluate(object(), tasks="isotropy", data_dir=proj / "data", report=proj / "r2.md", plot_dir=plots,
                        overwrite=True)
    assert (plots / "mine.png").read_bytes() == b"the user's"
    assert not [p.name for p in proj.iterdir() if ".tmp" in p.name or p.name.endswith(".lock")]


# --------------------------------------------------------------------------- case 4
def _reproduce_cfg(proj: Path, out: str, **kw):
    from mirrorbert.reproduce import ReproduceConfig

    return ReproduceConfig(model=str(proj / "m"), output=out, data_dir=str(proj / "data"), quick=True, **kw)


def test_reproduce_output_follows_the_policy(proj, capsys, no_model_load):
    base = ["reproduce", "--model", "m", "--experiments", "sts"]
    (proj / "rep").mkdir()
    (proj / "rep" / "report.md").write_text("my own report\n", encoding="utf-8")
    refused(capsys, [*base, "--output", "rep"], "--output rep already exists")
    refused(capsys, [*base, "--output", "rep", "--overwrite"], "--output rep", "mirrorbert wrote")
    assert (proj / "rep" / "report.md").read_text(encoding="utf-8") == "my own report\n"
    refused(capsys, [*base, "--output", "m/rep"], "lies inside the input --model")
    refused(capsys, [*base, "--output", "data"], "is the input --data-dir")
    refused(capsys, [*base, "--output", "."], "is the current directory")


def test_reproduce_continues_its_own_folder_and_locks_it(proj):
    from mirrorbert.reproduce.runner import REPRODUCE_KIND, output_folder

    data = proj / "data"
    with output_folder(_reproduce_cfg(proj, "rep"), data) as out:
        safety.claim_files(out, ["cells/a--s0.json"], REPRODUCE_KIND)
        (out / "cells").mkdir()
        (out / "cells" / "a--s0.json").write_text("{}\n", encoding="utf-8")
        with pytest.raises(UserError, match="another mirrorbert run"):  # a second run on the same folder
            with output_folder(_reproduce_cfg(proj, "rep"), data):
                pass
    assert safety.read_marker(proj / "rep")["kind"] == REPRODUCE_KIND
    with output_folder(_reproduce_cfg(proj, "rep"), data) as out:  # continued without --overwrite: cache kept
        assert (out / "cells" / "a--s0.json").is_file()
    (proj / "rep" / "notes.md").write_text("mine\n", encoding="utf-8")  # a user's file appears in it
    with pytest.raises(UserError, match="notes.md, which mirrorbert did not write"):
        with output_folder(_reproduce_cfg(proj, "rep"), data):
            pass
    with pytest.raises(UserError, match="notes.md, which mirrorbert did not write"):
        with output_folder(_reproduce_cfg(proj, "rep", overwrite=True), data):
            pass
    (proj / "rep" / "notes.md").unlink()
    with output_folder(_reproduce_cfg(proj, "rep", overwrite=True), data) as out:  # --overwrite: starts over
        assert not (out / "cells").exists()


def test_a_claimed_file_proves_nothing_until_it_is_recorded(proj):
    """A run killed between claiming a file and recording its digest leaves a file its marker names without
    a digest: a marker's word is no proof, so the next run names it instead of replacing it."""
    from mirrorbert.reproduce.runner import REPRODUCE_KIND, output_folder

    with output_folder(_reproduce_cfg(proj, "rep"), proj / "data") as out:
        pass
    safety.claim_files(out, ["report.md"], REPRODUCE_KIND)  # what the killed run did, then it wrote the file
    (proj / "rep" / "report.md").write_text("half a rep", encoding="utf-8")
    for overwrite in (False, True):
        with pytest.raises(UserError, match="report.md, which mirrorbert did not write"):
            with output_folder(_reproduce_cfg(proj, "rep", overwrite=overwrite), proj / "data"):
                pass
    assert (proj / "rep" / "report.md").read_text(encoding="utf-8") == "half a rep"
    (proj / "rep" / "report.md").unlink()  # moved away: a claim of a missing file loses nothing
    with output_folder(_reproduce_cfg(proj, "rep"), proj / "data"):
        pass


# --------------------------------------------------------------------------- case 6
def test_overwrite_replaces_only_what_mirrorbert_wrote(proj, capsys):
    argv = ["train", "--model", "m", *TRAIN, "--output", "out"]
    assert main(argv) == 0
    marker = safety.read_marker(proj / "out")
    assert "mirrorbert.json" in marker["files"] and "model.safetensors" in marker["files"]
    (proj / "out" / "notes.md").write_text("my notes\n", encoding="utf-8")
    refused(capsys, [*argv, "--overwrite"], "--output out", "notes.md, which mirrorbert did not write")
    assert (proj / "out" / "notes.md").read_text(encoding="utf-8") == "my notes\n"
    (proj / "out" / "notes.md").unlink()
    card = proj / "out" / "README.md"  # a file mirrorbert wrote, then the user edited: theirs now
    card.write_text(card.read_text(encoding="utf-8") + "\nmy results\n", encoding="utf-8")
    refused(capsys, [*argv, "--overwrite"], "--output out", "README.md, which mirrorbert did not write (or which changed")
    assert card.read_text(encoding="utf-8").endswith("my results\n")
    card.unlink()
    assert main([*argv, "--overwrite"]) == 0  # all of it ours (a file of ours may be missing): replaced


def test_a_mirrorbert_json_alone_does_not_make_a_folder_ours(proj, capsys, no_model_load):
    (proj / "out").mkdir()
    (proj / "out" / "mirrorbert.json").write_text("{}\n", encoding="utf-8")
    (proj / "out" / "thesis.tex").write_text("chapter 1\n", encoding="utf-8")
    refused(capsys, ["train", "--model", "m", *TRAIN, "--output", "out", "--overwrite"], "mirrorbert wrote")
    (proj / "out" / safety.MARKER).write_text("written by mirrorbert\n", encoding="utf-8")  # not a marker's JSON
    refused(capsys, ["train", "--model", "m", *TRAIN, "--output", "out", "--overwrite"],
            f"no {safety.MARKER} that mirrorbert writes")
    assert (proj / "out" / "thesis.tex").exists()


def test_foreign_file_looks_into_subfolders_and_checkpoints(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_text("a", encoding="utf-8")
    (out / "sub" / "b.txt").write_text("b", encoding="utf-8")
    safety.mark_folder(out, files=["a.txt", "sub/b.txt"])
    assert foreign_file(out) is None
    (out / "sub" / "c.txt").write_text("c", encoding="utf-8")
    assert foreign_file(out) == out / "sub" / "c.txt"
    (out / "sub" / "c.txt").unlink()
    (out / ".out.lock").write_text("123\n", encoding="utf-8")  # mirrorbert's own lock: not foreign
    nested = out / "models" / "x"
    nested.mkdir(parents=True)
    (nested / "w.bin").write_bytes(b"w")
    safety.mark_folder(nested, files=["w.bin"])
    assert foreign_file(out) is None  # the nested marker vouches for its folder
    (nested / "user.txt").write_text("u", encoding="utf-8")
    assert foreign_file(out) == nested / "user.txt"


# --------------------------------------------------------------------------- case 7
def test_a_link_at_the_output_is_replaced_never_followed(proj, tmp_path, capsys):
    real = tmp_path / "elsewhere" / "model"
    real.parent.mkdir()
    (proj / "link").symlink_to(real, target_is_directory=True)  # dangling: its target would be created
    refused(capsys, ["train", "--model", "m", *TRAIN, "--output", "link"], "--output link already exists",
            "which does not exist", "pass --overwrite to replace the link")
    assert not real.exists() and (proj / "link").is_symlink()
    assert main(["train", "--model", "m", *TRAIN, "--output", "link", "--overwrite"]) == 0
    assert not (proj / "link").is_symlink() and (proj / "link" / "mirrorbert.json").is_file()
    assert not real.exists()


def test_overwrite_onto_a_linked_file_replaces_the_link_not_its_target(proj, tmp_path, capsys):
    import numpy as np

    target = tmp_path / "vectors" / "v.npy"
    target.parent.mkdir()
    np.save(target, np.zeros((1, 1)))
    before = target.read_bytes()
    (proj / "v.npy").symlink_to(target)
    refused(capsys, ["encode", "--model", "m", "--input", "sents.txt", "--output", "v.npy", "--no-progress",
                     "--device", "cpu"], "--output v.npy already exists (a symlink to")
    assert main(["encode", "--model", "m", "--input", "sents.txt", "--output", "v.npy", "--overwrite",
                 "--no-progress", "--device", "cpu"]) == 0
    assert not (proj / "v.npy").is_symlink() and np.load(proj / "v.npy").shape[0] == len(
        (proj / "sents.txt").read_text(encoding="utf-8").splitlines())
    assert target.read_bytes() == before


# --------------------------------------------------------------------------- building blocks
def test_atomic_output_file_leaves_the_old_file_on_failure(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError), safety.atomic_output_file(path, overwrite=True) as tmp:
        tmp.write_text("half", encoding="utf-8")
        raise RuntimeError("killed")
    assert path.read_text(encoding="utf-8") == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_an_output_that_appears_during_the_run_is_not_replaced(tmp_path):
    path = tmp_path / "r.json"
    with pytest.raises(UserError, match="already exists"), safety.atomic_output_file(path) as tmp:
        tmp.write_text("new", encoding="utf-8")
        path.write_text("the user's", encoding="utf-8")
    assert path.read_text(encoding="utf-8") == "the user's"


def test_a_file_where_the_output_folder_goes_is_refused(proj, capsys, no_model_load):
    (proj / "parent").write_text("a file\n", encoding="utf-8")
    refused(capsys, ["train", "--model", "m", *TRAIN, "--output", "parent/out"], "is a file, not a folder")
    refused(capsys, ["eval", "--model", "m", "--tasks", "sts", "--report", "parent/r.md"], "is a file, not a folder")


def test_write_plan_locks_every_output(proj):
    plan = safety.WritePlan({}, overwrite=False).file("--output", "a.json").folder("--plot-dir", "plots")
    with plan.locked():
        with pytest.raises(UserError, match="another mirrorbert run"), contextlib.ExitStack() as stack:
            safety.WritePlan({}).file("--output", "a.json").lock(stack)
        with pytest.raises(UserError, match="another mirrorbert run"), contextlib.ExitStack() as stack:
            safety.WritePlan({}).folder("--output", "plots").lock(stack)
    with contextlib.ExitStack() as stack:  # released at the end
        safety.WritePlan({}).file("--output", "a.json").lock(stack)


def test_reproduce_continues_after_a_kill_left_temporaries(proj):
    """`kill -9` leaves locks and half-written temporaries: they are mirrorbert's, the folder is continued."""
    from mirrorbert.reproduce.runner import output_folder

    with output_folder(_reproduce_cfg(proj, "rep"), proj / "data") as out:
        pass
    (out / "models" / ".mirror-s0.tmp-k2j3h4g5").mkdir(parents=True)  # a model folder being written
    (out / "models" / ".mirror-s0.tmp-k2j3h4g5" / "model.safetensors").write_bytes(b"half")
    (out / "models" / ".mirror-s0.lock").write_text("4242\n", encoding="utf-8")
    (out / "cells").mkdir()
    (out / "cells" / ".sts__after--s0.json.tmp").write_text("{", encoding="utf-8")
    with output_folder(_reproduce_cfg(proj, "rep"), proj / "data"):
        pass
    assert "models/.mirror-s0.lock" not in safety.read_marker(out)["files"]  # temporaries are never listed


def test_an_interrupted_first_marker_write_leaves_the_folder_claimable(proj):
    from mirrorbert.reproduce.runner import output_folder

    (proj / "rep").mkdir()
    (proj / "rep" / f".{safety.MARKER}.tmp").write_text("{", encoding="utf-8")
    with output_folder(_reproduce_cfg(proj, "rep"), proj / "data") as out:
        assert safety.read_marker(out)["kind"] == "reproduce"
