"""Packed execution equals padded execution: embeddings, one step's loss and gradients, N training steps,
drophead per view, controlled dropout, saved models, input order, and the fallback for other models."""

import functools
import json
import re
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mirrorbert.encoder import packing
from mirrorbert.compat import installed_version, transformers_takes_4d_mask
from mirrorbert.mirror.config import TrainConfig
from mirrorbert.encoder.model import Encoder
from mirrorbert.mirror.loss import MirrorInfoNCE
from mirrorbert.encoder.packing import choose_layout, length_groups, pack, plan_rows
from mirrorbert.runtime.randomness import replay_rng
from mirrorbert.mirror.step import embed_views
from mirrorbert.mirror.train import train
from mirrorbert.encoder.dropout import DropHead, dropout_overrides
from tiny_models import (
    CORPUS,
    make_tiny_bert,
    make_tiny_distilbert,
    make_tiny_electra,
    make_tiny_roberta,
    make_tiny_mlm,
    make_tiny_xlm_roberta,
)

BUILDERS = {
    "bert": make_tiny_bert,
    "roberta": make_tiny_roberta,
    "xlm-roberta": make_tiny_xlm_roberta,
    "electra": make_tiny_electra,
    "distilbert": make_tiny_distilbert,
    **{kind: functools.partial(make_tiny_mlm, kind) for kind in ("camembert", "albert", "ernie", "megatron-bert", "data2vec-text",
                                                                  "mpnet", "roformer", "deberta-v2", "modernbert")},
}
POOLINGS = ("cls", "mean", "first-last")
# Short and long strings, one longer than the small row budget used below, so rows hold several views,
# a view fills a row on its own and the last row is partly empty.
TEXTS = CORPUS + ["a", "the dog", " ".join(CORPUS[:4])]
SMALL_BUDGET = 24
# A key projection's bias adds the same amount to every score of a query, which softmax cancels: its gradient
# is zero up to rounding, and AdamW scales that rounding noise into steps of about lr, whose sign depends on how
# the float sums fall. Such weights are left out of the weight comparisons (the loss and the other weights
# carry the check).
KEY_BIAS = re.compile(r"(^|\.)(key|k|k_proj|key_proj)\.bias$")


@pytest.fixture(scope="session", params=list(BUILDERS))
def arch(request, tmp_path_factory):
    try:
        folder = BUILDERS[request.param](tmp_path_factory.mktemp(request.param))
    except (ValueError, KeyError, ImportError) as exc:
        pytest.skip(f"the installed transformers cannot build {request.param!r}: {exc}")
    return request.param, folder


def test_every_packable_type_is_proven_here():
    assert set(packing.PACKABLE_MODEL_TYPES) == set(BUILDERS)


@pytest.fixture
def small_rows(monkeypatch):
    """Small packed rows and small length groups, so both layouts split the test batches."""
    monkeypatch.setattr(packing, "ROW_BUDGET", SMALL_BUDGET)
    monkeypatch.setattr(packing, "GROUP_BUDGET", SMALL_BUDGET)


def load(folder, pooling="cls", dropout=0.0):
    from transformers import AutoConfig

    overrides = dropout_overrides(AutoConfig.from_pretrained(folder), dropout)
    return Encoder.load(folder, pooling=pooling, device="cpu", config_overrides=overrides)


def test_plan_rows_places_every_view_once_within_the_budget():
    lengths = [5, 30, 3, 12, 12, 7, 1, 24, 9]
    rows = plan_rows(lengths, budget=24)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    for row in rows:
        assert sum(lengths[i] for i in row) <= 24 or len(row) == 1
    assert rows == plan_rows(list(lengths), budget=24)  # a function of the lengths only
    assert len(rows) == 5  # 103 tokens: 30 alone, then four rows of <= 24


def test_pack_layout_positions_and_owners():
    batch = pack([[7, 8, 9], [5, 6], [4]], pad_id=0, first_position=2, budget=8)
    assert batch.input_ids.shape == (1, 6)
    assert batch.input_ids.tolist() == [[7, 8, 9, 5, 6, 4]]
    assert batch.position_ids.tolist() == [[2, 3, 4, 2, 3, 2]]
    assert batch.view_of_token.tolist() == [[0, 0, 0, 1, 1, 2]]
    assert batch.first_token.tolist() == [0, 3, 5]
    mask = batch.attention_mask("sdpa", torch.float32)[0, 0]
    assert mask[0].tolist() == [True, True, True, False, False, False]
    assert mask[5].tolist() == [False] * 5 + [True]


def test_block_mask_in_the_form_the_installed_transformers_takes():
    """transformers 5 takes the prepared (rows, 1, q, k) mask, 4.x the (rows, q, k) one (compat.py); same blocks."""
    batch = pack([[7, 8], [5]], pad_id=0, budget=8)
    prepared = batch.attention_mask("sdpa", torch.float32)
    plain = batch.attention_mask("eager", torch.float32, prepared=False)
    assert prepared.shape == (1, 1, 3, 3) and plain.shape == (1, 3, 3)
    assert torch.equal(prepared[:, 0].float(), plain)
    assert plain[0].tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    assert transformers_takes_4d_mask() == (installed_version("transformers") >= (5,))
    assert installed_version("transformers") >= (4, 45) and installed_version("no-such-distribution") == (0,)


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("budget", ["small", "default"])
def test_packed_and_grouped_embeddings_equal_padded(arch, pooling, budget, monkeypatch):
    name, folder = arch
    if budget == "small":  # several rows and several length groups
        monkeypatch.setattr(packing, "ROW_BUDGET", SMALL_BUDGET)
        monkeypatch.setattr(packing, "GROUP_BUDGET", SMALL_BUDGET)
    enc = load(folder, pooling)
    enc.eval()
    if name == "distilbert" and installed_version("transformers") < (5,):
        # DistilBertModel.forward takes position_ids from transformers 5 on: 4.x runs length groups instead
        assert "position_ids" in packing.unsupported_reason(enc.model)
    elif packing.PACKING_RECIPES[name].needs_4d and not transformers_takes_4d_mask():
        assert "transformers 5" in packing.unsupported_reason(enc.model)
    elif installed_version("transformers") < packing.PACKING_RECIPES[name].min_transformers:
        assert "packed from transformers" in packing.unsupported_reason(enc.model)
    else:
        assert packing.unsupported_reason(enc.model) is None, name
    ids = enc.tokenize(TEXTS)
    with torch.no_grad():
        padded = enc.embed(ids, packing=False)
        packed = enc.embed(ids, packing=True)
        grouped = enc.embed(ids, packing="grouped")
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    torch.testing.assert_close(grouped, padded, atol=1e-5, rtol=0)  # and in input order
    if budget == "small":
        rows = plan_rows([len(s) for s in ids], SMALL_BUDGET)
        assert 1 < len(rows) < len(ids)
        assert len(length_groups([len(s) for s in ids])) > 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_packed_equals_padded_under_reduced_precision_autocast(arch, precision):
    """The same layouts under the autocast a bf16/fp16 run uses: equal to padded execution within that
    precision's rounding (every row's cosine to the padded one at least 0.999)."""
    from mirrorbert.runtime.device import autocast

    name, folder = arch
    enc = load(folder, "mean")
    enc.eval()
    ids = enc.tokenize(TEXTS)
    with torch.no_grad(), autocast(torch.device("cpu"), precision):
        padded = enc.embed(ids, packing=False).float()
        packed = enc.embed(ids, packing=True).float()
        grouped = enc.embed(ids, packing="grouped").float()
    for layout, vectors in (("packed", packed), ("grouped", grouped)):
        cosine = torch.nn.functional.cosine_similarity(vectors, padded)
        assert cosine.min() >= 0.999, f"{name} {precision} {layout}: cosine {cosine.min():.5f}"


def test_auto_layout_per_batch(tiny_bert_folder):
    enc = load(tiny_bert_folder)
    mixed = [[5] * 40] + [[5] * 5] * 30  # padding would waste most of this batch
    equal = [[5] * 10] * 30  # like encode's length-sorted batches: nothing to gain
    assert choose_layout(enc.model, None, mixed) == "packed"
    assert choose_layout(enc.model, None, equal) == "padded"
    assert choose_layout(enc.model, True, equal) == "packed"  # explicit requests win
    assert choose_layout(enc.model, "grouped", mixed) == "grouped"
    assert choose_layout(enc.model, "grouped", equal) == "padded"  # one group is the padded batch
    assert choose_layout(enc.model, False, mixed) == "padded"


def test_length_groups_sort_and_bound_the_padded_size():
    lengths = [5, 30, 3, 12, 12, 7, 1, 24, 9]
    groups = length_groups(lengths, budget=24)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(lengths)  # shortest first: each group pads to a near neighbour
    for g in groups:
        assert len(g) * max(lengths[i] for i in g) <= 24 or len(g) == 1
    assert groups == [[6, 2, 0], [5, 8], [3, 4], [7], [1]]


def _step(enc, first, second, packing_on):
    enc.zero_grad()
    enc.packing = packing_on
    embeddings = embed_views(enc, first, second, precision="fp32")
    loss = MirrorInfoNCE(0.05)(embeddings)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("pooling", POOLINGS)
def test_one_training_step_same_loss_and_gradients(arch, pooling, small_rows):
    _, folder = arch
    enc = load(folder, pooling)
    enc.train()
    first = enc.tokenize(TEXTS)
    second = [ids[:1] + [enc.tokenizer.mask_token_id] + ids[2:] for ids in first]
    loss_pad, grads_pad = _step(enc, first, second, False)
    for layout in (True, "grouped"):
        loss, grads = _step(enc, first, second, layout)
        torch.testing.assert_close(loss, loss_pad, atol=1e-5, rtol=1e-5)
        assert grads_pad.keys() == grads.keys()
        for key in grads_pad:
            torch.testing.assert_close(grads[key], grads_pad[key], atol=1e-5, rtol=1e-4, msg=f"{layout} {key}")


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "strings.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def _train(folder, data, out, packing_mode, **kw):
    cfg = dict(model=str(folder), data=str(data), output=str(out), batch_size=6, max_length=24, steps=4,
               show_progress=False, lr=1e-3, temperature=0.05, mask_span=1, pooling="mean", dropout=0.0,
               packing=packing_mode, seed=3, precision="fp32")
    cfg.update(kw)
    return train(TrainConfig(**cfg))


@pytest.mark.parametrize("mode", ["on", "grouped"])
def test_n_steps_packed_and_padded_give_the_same_weights(arch, data_file, tmp_path, small_rows, mode):
    _, folder = arch
    padded = _train(folder, data_file, tmp_path / "padded", "off")
    packed = _train(folder, data_file, tmp_path / "packed", mode)
    assert packed.final_loss == pytest.approx(padded.final_loss, abs=1e-4)
    wa, wb = load_file(str(padded.output / "model.safetensors")), load_file(str(packed.output / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for key in (k for k in wa if not KEY_BIAS.search(k)):
        # AdamW divides by sqrt(v): an element whose gradient is ~0 turns float rounding into a visible part of
        # one step's update (seen: one DistilBERT weight of 2048 off by 2e-5 after 4 steps at lr 1e-3, grouped).
        # A wrong layout moves many weights by ~lr (1e-3); 1e-4 still catches that.
        torch.testing.assert_close(wb[key], wa[key], atol=1e-4, rtol=1e-4, msg=key)
    assert json.loads((packed.output / "mirrorbert.json").read_text())["training"]["config"]["packing"] == mode


def test_a_packed_run_resumes_exactly(arch, data_file, tmp_path, small_rows):
    """Checkpoint after 2 of 4 packed steps, resume: the weights of 4 straight packed steps."""
    _, folder = arch
    straight = _train(folder, data_file, tmp_path / "straight", "on", save_every=2, keep_checkpoints=2)
    resumed = _train(folder, data_file, tmp_path / "resumed", "on",
                     resume=str(tmp_path / "straight.checkpoints" / "step-2"))
    wa, wb = load_file(str(straight.output / "model.safetensors")), load_file(str(resumed.output / "model.safetensors"))
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], atol=1e-6, rtol=1e-6, msg=key)


@pytest.fixture(scope="module")
def tiny_bert_folder(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("bert-packing"))


def test_drophead_is_drawn_per_view_in_packed_rows(tiny_bert_folder, small_rows):
    """Same draws as the padded batch (so equal vectors), and two copies of a string in one row differ."""
    enc = load(tiny_bert_folder, "mean")
    drophead = DropHead(enc.model, 0.5)
    enc.train()
    ids = enc.tokenize(["the cat sat", "the cat sat", "a dog ran in the park", "the cat sat"])
    assert len(plan_rows([len(s) for s in ids], SMALL_BUDGET)) < len(ids)  # copies share rows
    try:
        with torch.no_grad():
            with replay_rng():
                padded = enc.embed(ids, packing=False)
            packed = enc.embed(ids, packing=True)
    finally:
        drophead.remove()
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    assert (packed[0] - packed[1]).abs().max() > 1e-3 or (packed[0] - packed[3]).abs().max() > 1e-3


def test_controlled_dropout_gives_identical_views_when_packed(tiny_bert_folder, small_rows):
    enc = load(tiny_bert_folder, "cls", dropout=0.2)
    drophead = DropHead(enc.model, 0.3)
    enc.train()
    enc.packing = True
    ids = enc.tokenize(TEXTS)
    try:
        with torch.no_grad():
            free = embed_views(enc, ids, ids, precision="fp32")
            controlled = embed_views(enc, ids, ids, precision="fp32", controlled_dropout=True)
    finally:
        drophead.remove()
    n = len(ids)
    assert (free[:n] - free[n:]).abs().max() > 1e-4
    assert torch.equal(controlled[:n], controlled[n:])


def test_packed_encode_keeps_input_order(tiny_bert_folder, small_rows):
    enc = load(tiny_bert_folder, "mean")
    texts = TEXTS[::-1] + TEXTS[:3]
    together = enc.encode(texts, batch_size=7, packing=True)
    one_by_one = np.stack([enc.encode(t, packing=False) for t in texts])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_sentence_transformers_reads_a_model_trained_with_packing(tiny_bert_folder, data_file, tmp_path, pooling):
    from sentence_transformers import SentenceTransformer

    result = _train(tiny_bert_folder, data_file, tmp_path / "out", "on", pooling=pooling, steps=2)
    ours = Encoder.load(result.output, device="cpu").encode(TEXTS, batch_size=5, packing=True)
    st = SentenceTransformer(str(result.output), device="cpu").encode(TEXTS, batch_size=5)
    np.testing.assert_allclose(ours, st, atol=1e-5)


def test_unsupported_model_falls_back_to_length_groups_and_logs_once(tiny_bert_folder, caplog, small_rows):
    from transformers import AutoTokenizer, RemBertConfig, RemBertModel

    tok = AutoTokenizer.from_pretrained(tiny_bert_folder)
    torch.manual_seed(0)
    model = RemBertModel(RemBertConfig(vocab_size=len(tok), hidden_size=32, input_embedding_size=16,
                                       num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                       max_position_embeddings=64, pad_token_id=tok.pad_token_id),
                         add_pooling_layer=False)
    enc = Encoder(model, tok, pooling="mean")
    enc.eval()
    ids = enc.tokenize(TEXTS)
    with caplog.at_level(logging.INFO, logger="mirrorbert.encoder.packing"), torch.no_grad():
        first = enc.embed(ids, packing=True)
        second = enc.embed(ids)
    padded = enc.embed(ids, packing=False)
    torch.testing.assert_close(first, padded)
    torch.testing.assert_close(second, padded)
    lines = [r.getMessage() for r in caplog.records if "packing off" in r.getMessage()]
    assert len(lines) == 1 and "rembert" in lines[0]
    assert choose_layout(enc.model, None, ids) == "grouped"  # small groups here: several of them


def test_cli_encode_packed_equals_padded_encode_and_bad_mode_is_refused(tiny_bert_folder, tmp_path, capsys):
    from mirrorbert.cli.app import main

    texts = tmp_path / "in.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "on.npy"
    done = subprocess.run([sys.executable, "-m", "mirrorbert.cli.app", "encode", "--model", str(tiny_bert_folder),
                           "--input", str(texts), "--output", str(out), "--packing", "on", "--no-progress",
                           "--device", "cpu"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    padded = Encoder.load(tiny_bert_folder, device="cpu").encode(TEXTS, packing=False)
    np.testing.assert_allclose(np.load(out), padded, atol=1e-5)
    code = main(["train", "--model", str(tiny_bert_folder), "--data", str(texts), "--output", str(tmp_path / "m"),
                 "--packing", "sometimes"])
    assert code == 2 and "--packing" in capsys.readouterr().err
