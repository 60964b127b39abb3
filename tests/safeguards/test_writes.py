"""Never lose a user's files: path rules, --overwrite, locks, typed config, up-front checks, each through the real
CLI; an up-front check's one line comes with the model loader replaced by a trap, so it provably came first.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from mirrorbert.safeguards import writes as safety
from mirrorbert.safeguards.writes.locks import folder_lock, lock_path
from mirrorbert.safeguards.writes.paths import check_not_overlapping
from mirrorbert.cli.app import main
from mirrorbert.mirror.config import load_config_file, resolve_config
from mirrorbert.errors import UserError
from support import one_error_line, snapshot


@pytest.fixture
def proj(tmp_path, monkeypatch, corpus):
    """A user's project folder as cwd, with a private HOME: no test touches the repo or the real home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "proj"
    root.mkdir()
    (root / "sents.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    (root / "notes.md").write_text("my notes\n", encoding="utf-8")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def no_model_load(monkeypatch):
    """Any attempt to load a model fails the test: the check under test must come before it."""
    import mirrorbert.encoder.model
    import mirrorbert.mirror.train

    def trap(*args, **kwargs):
        raise AssertionError("the model was loaded before the error was found")

    monkeypatch.setattr(mirrorbert.encoder.model.Encoder, "load", trap)
    monkeypatch.setattr(mirrorbert.mirror.train, "open_start_model", trap)


def train_args(model, data, output, *extra) -> list[str]:
    return ["train", "--model", str(model), "--data", str(data), "--output", str(output), "--steps", "1",
            "--batch-size", "4", "--max-length", "16", "--no-progress", "--device", "cpu", *extra]


# --------------------------------------------------------------------------- section 1: data loss
@pytest.mark.parametrize("output", [".", "..", "HOME"])
def test_output_is_or_contains_cwd_or_home(proj, tiny_bert, capsys, no_model_load, output):
    output = os.environ["HOME"] if output == "HOME" else output
    before = snapshot(proj)
    assert main(train_args(tiny_bert, "sents.txt", output, "--overwrite")) == 2
    one_error_line(capsys, "refusing to write there")
    assert snapshot(proj) == before


def test_output_containing_the_data(proj, tiny_bert, capsys, no_model_load):
    sub = proj / "sub"
    sub.mkdir()
    shutil.copy(proj / "sents.txt", sub / "sents.txt")
    before = snapshot(proj)
    assert main(train_args(tiny_bert, "sub/sents.txt", "sub", "--overwrite")) == 2
    one_error_line(capsys, "contains the input --data")
    assert snapshot(proj) == before


def test_output_is_the_model(proj, tiny_bert, capsys, no_model_load):
    model = proj / "m"
    shutil.copytree(tiny_bert, model)
    before = snapshot(model)
    assert main(train_args(model, "sents.txt", model, "--overwrite")) == 2
    one_error_line(capsys, "is the input --model")
    assert main(train_args(model, "sents.txt", model / "inside")) == 2
    one_error_line(capsys, "lies inside the input --model")
    assert snapshot(model) == before


def test_output_is_the_config_file_folder(proj, tiny_bert, capsys, no_model_load):
    conf = proj / "conf"
    conf.mkdir()
    (conf / "run.yaml").write_text("steps: 1\n", encoding="utf-8")
    assert main(train_args(tiny_bert, "sents.txt", "conf", "--overwrite", "--config", "conf/run.yaml")) == 2
    one_error_line(capsys, "contains the input --config")
    assert (conf / "run.yaml").exists()


def test_overwrite_refuses_a_folder_mirrorbert_did_not_write(proj, tiny_bert, capsys, no_model_load):
    (proj / "results").mkdir()
    (proj / "results" / "thesis.tex").write_text("years of work", encoding="utf-8")
    assert main(train_args(tiny_bert, "sents.txt", "results", "--overwrite")) == 2
    one_error_line(capsys, "only replaces a folder mirrorbert wrote")
    assert (proj / "results" / "thesis.tex").read_text(encoding="utf-8") == "years of work"


def test_overwrite_string_false_in_config_is_refused(proj, tiny_bert, capsys):
    assert main(train_args(tiny_bert, "sents.txt", "out")) == 0
    capsys.readouterr()
    before = snapshot(proj / "out")
    Path("run.yaml").write_text('overwrite: "false"\n', encoding="utf-8")
    assert main(train_args(tiny_bert, "sents.txt", "out", "--config", "run.yaml")) == 2
    one_error_line(capsys, "run.yaml", "overwrite must be true or false")
    assert snapshot(proj / "out") == before


def test_second_concurrent_run_is_refused(proj, tiny_bert, capsys, no_model_load):
    with folder_lock(proj / "out", "--output"):  # the first run, still training
        assert main(train_args(tiny_bert, "sents.txt", "out")) == 2
        one_error_line(capsys, "another mirrorbert run is using it")
    with folder_lock(proj / "out.checkpoints", "--checkpoint-dir"):
        assert main(train_args(tiny_bert, "sents.txt", "out")) == 2
        one_error_line(capsys, "--checkpoint-dir", "another mirrorbert run")
    assert not (proj / "out").exists()


def test_lock_is_released_and_removed_after_a_run(proj, tiny_bert):
    assert main(train_args(tiny_bert, "sents.txt", "out")) == 0
    assert not lock_path(proj / "out").exists()
    with folder_lock(proj / "out", "--output"):  # free again
        pass


def test_rerun_over_checkpoints_of_another_run_needs_resume_or_overwrite(proj, tiny_bert, capsys):
    first = train_args(tiny_bert, "sents.txt", "out", "--save-every", "1")
    assert main(first) == 0
    old = snapshot(proj / "out.checkpoints")
    shutil.rmtree(proj / "out")
    capsys.readouterr()
    assert main(first) == 2  # a new run would mix its checkpoints with the old ones
    one_error_line(capsys, "holds checkpoints of an earlier run", "--resume")
    assert snapshot(proj / "out.checkpoints") == old
    assert main([*first, "--overwrite", "--seed", "7"]) == 0  # discarding them is explicit
    meta = json.loads((proj / "out.checkpoints" / "step-1" / "checkpoint.json").read_text(encoding="utf-8"))
    assert meta["config"]["seed"] == 7


def test_checkpoint_dir_equal_to_output_is_refused(proj, tiny_bert, capsys, no_model_load):
    assert main(train_args(tiny_bert, "sents.txt", "x", "--checkpoint-dir", "x")) == 2
    one_error_line(capsys, "overlap")
    assert main(train_args(tiny_bert, "sents.txt", "x", "--checkpoint-dir", "x/ck")) == 2
    one_error_line(capsys, "overlap")


# --------------------------------------------------------------------------- section 2: fail before the work
@pytest.mark.parametrize("extra, fragments", [
    ([], ("--output /proc/mirrorbert-x", "cannot write")),
    (["--checkpoint-dir", "/proc/mirrorbert-ck"], ("--checkpoint-dir", "cannot write")),
    (["--log-dir", "/proc/mirrorbert-logs"], ("--log-dir", "cannot write")),
])
def test_unwritable_locations_fail_up_front(proj, tiny_bert, capsys, no_model_load, extra, fragments):
    output = "/proc/mirrorbert-x" if not extra else "out"
    assert main(train_args(tiny_bert, "sents.txt", output, *extra)) == 2
    one_error_line(capsys, *fragments)


def test_output_below_a_file_fails_up_front(proj, tiny_bert, capsys, no_model_load):
    assert main(train_args(tiny_bert, "sents.txt", "notes.md/sub")) == 2
    one_error_line(capsys, "notes.md", "is a file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_fails_up_front(proj, tiny_bert, capsys, no_model_load):
    (proj / "ro").mkdir()
    (proj / "ro").chmod(0o555)
    try:
        assert main(train_args(tiny_bert, "sents.txt", "ro/out")) == 2
        one_error_line(capsys, "cannot write")
    finally:
        (proj / "ro").chmod(0o755)


def test_too_little_free_space_fails_up_front(proj, tiny_bert, capsys, no_model_load, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 10))
    assert main(train_args(tiny_bert, "sents.txt", "out")) == 2
    one_error_line(capsys, "free in", "needed")


def test_encode_and_eval_outputs_fail_before_the_model_loads(proj, tiny_bert, capsys, no_model_load):
    assert main(["encode", "--model", str(tiny_bert), "--input", "sents.txt", "--output", "/proc/x/v.npy"]) == 2
    one_error_line(capsys, "--output", "cannot write")
    assert main(["eval", "--model", str(tiny_bert), "--tasks", "sts", "--output", "/proc/x/r.json"]) == 2
    one_error_line(capsys, "--output", "cannot write")
    assert main(["eval", "--model", str(tiny_bert), "--tasks", "sts", "--report", "notes.md/r.md"]) == 2
    one_error_line(capsys, "--report", "is a file")


def test_pretrain_mlm_cache_dir_fails_up_front(proj, tiny_bert, capsys, monkeypatch):
    import mirrorbert.mlm.pretrain

    monkeypatch.setattr(mirrorbert.mlm.pretrain, "build_model", lambda cfg: pytest.fail("model loaded"))
    assert main(["pretrain-mlm", "--corpus", "sents.txt", "--model", str(tiny_bert), "--output", "mlm",
                 "--cache-dir", "/proc/mirrorbert-cache", "--no-progress"]) == 2
    one_error_line(capsys, "--cache-dir", "cannot write")
    assert main(["pretrain-mlm", "--corpus", "sents.txt", "--model", str(tiny_bert), "--output", ".",
                 "--overwrite", "--no-progress"]) == 2
    one_error_line(capsys, "refusing to write there")
    assert (proj / "sents.txt").exists()


def test_finished_output_has_normal_permissions_and_a_marker(proj, tiny_bert):
    assert main(train_args(tiny_bert, "sents.txt", "out", "--save-every", "1")) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((proj / "out").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((proj / "out" / "model.safetensors").stat().st_mode) == 0o666 & ~umask
    assert (proj / "out" / safety.MARKER).exists()
    for step in (proj / "out.checkpoints").glob("step-*"):
        assert stat.S_IMODE(step.stat().st_mode) == 0o777 & ~umask


# --------------------------------------------------------------------------- typed config
def write_config(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_yaml_exponent_without_dot_is_a_number(tmp_path):
    cfg = resolve_config({"output": "x"}, write_config(tmp_path, "lr: 2e-5\ntemperature: 1\n"))
    assert cfg.lr == 2e-5 and isinstance(cfg.lr, float) and cfg.temperature == 1.0


@pytest.mark.parametrize("text, fragment", [
    ('overwrite: "false"\n', "overwrite must be true or false, not 'false' (text)"),
    ("overwrite: 0\n", "overwrite must be true or false"),
    ("preset: [word]\n", "preset must be text, not a list"),
    ("model: 123\n", "model must be text"),
    ("lang: no\n", "lang must be text, not false (a boolean)"),
    ("batch_size: 3.5\n", "batch_size must be a whole number"),
    ("batch_size: true\n", "batch_size must be a whole number"),
    ("lr: {a: 1}\n", "lr must be a number, not a mapping"),
    ("lr: fast\n", "lr must be a number"),
])
def test_config_values_of_the_wrong_type(tmp_path, text, fragment):
    path = write_config(tmp_path, text)
    with pytest.raises(UserError) as info:
        resolve_config({"output": "x"}, path)
    assert str(info.value).startswith(f"--config {path}: ") and fragment in str(info.value)


def test_json_config_is_typed_too(tmp_path):
    with pytest.raises(UserError, match="show_progress must be true or false"):
        load_config_file(write_config(tmp_path, '{"show_progress": "no"}', "run.json"))


def test_config_not_utf8_or_unreadable(tmp_path, monkeypatch):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"lr: 0.1\nmodel: caf\xe9\n")
    with pytest.raises(UserError, match="not valid UTF-8"):
        load_config_file(path)

    real_open = os.open

    def denied(name, *args, **kwargs):  # root reads any file: an unreadable one is simulated
        if os.fspath(name) == str(path):
            raise PermissionError(13, "Permission denied")
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(UserError, match="permission denied"):
        load_config_file(path)


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_temperature_must_be_finite(value):
    with pytest.raises(UserError, match=f"^temperature={value}: must be a finite number$"):
        resolve_config({"output": "x", "temperature": float(value)})


def test_library_callers_are_typed_too():
    from mirrorbert.mirror.config import TrainConfig

    with pytest.raises(UserError, match="^overwrite= must be true or false"):
        TrainConfig(output="x", overwrite="false")


def test_symlinks_are_resolved(proj, tiny_bert, capsys, no_model_load):
    (proj / "link").symlink_to(proj, target_is_directory=True)
    assert main(train_args(tiny_bert, "sents.txt", "link", "--overwrite")) == 2
    one_error_line(capsys, "is the current directory")
    (proj / "data").mkdir()
    (proj / "data" / "s.txt").write_text("a b\nc d\ne f\n", encoding="utf-8")
    (proj / "data-link").symlink_to(proj / "data", target_is_directory=True)
    assert main(train_args(tiny_bert, "data/s.txt", "data-link", "--overwrite")) == 2
    one_error_line(capsys, "contains the input --data")
    assert (proj / "data" / "s.txt").exists()


def test_fresh_subfolders_of_cwd_and_home_are_fine(proj):
    check_not_overlapping("out", "--output", {})
    check_not_overlapping(Path(os.environ["HOME"]) / "models" / "run1", "--output", {})


def test_gloss_pretrain_output_is_the_model(proj, tiny_bert, capsys, monkeypatch):
    import mirrorbert.gloss.pretrain

    monkeypatch.setattr(mirrorbert.gloss.pretrain, "load_masked_lm", lambda *args: pytest.fail("model loaded"))
    model = proj / "m"
    shutil.copytree(tiny_bert, model)
    before = snapshot(model)
    (proj / "t.tsv").write_text("cat\tthe cat sat\tsmall animal\n", encoding="utf-8")
    assert main(["gloss-pretrain", "--model", "m", "--triplets", "t.tsv", "--output", "m", "--overwrite",
                 "--no-progress"]) == 2
    one_error_line(capsys, "is the input --model")
    assert snapshot(model) == before


def test_only_rank_zero_locks_under_a_distributed_launcher(proj, monkeypatch):
    import contextlib

    with folder_lock(proj / "out", "--output"):  # rank 0 of the same job holds it
        monkeypatch.setenv("RANK", "1")
        with contextlib.ExitStack() as stack:
            safety.guard_run(stack, safety.RunPaths("out", {}, checkpoint_dir="out.checkpoints"), overwrite=False)
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(UserError, match="another mirrorbert run"), contextlib.ExitStack() as stack:
            safety.guard_run(stack, safety.RunPaths("out", {}, checkpoint_dir="out.checkpoints"), overwrite=False)
