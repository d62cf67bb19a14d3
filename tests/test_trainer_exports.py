"""The trainer exports, loaded with the trainers' own code (SpecForge and speculators from PyPI,
installed without their GPU dependencies by `make install`): our ids and masks arrive unchanged."""

from __future__ import annotations

import glob
import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from conftest import GROUNDTRUTH, TOKENIZERS
from servers import replay_server
from shared import GT, pipeline_manifest, run

N_TRUTH, N_PAID = 12, 8


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trainers")
    greedy = [r for r in GT if r["id"].endswith("-greedy") and r["source"] != "mtbench_turn2"]
    for name, recs in (("truth", greedy[:N_TRUTH]), ("paid", greedy[N_TRUTH : N_TRUTH + N_PAID])):
        (tmp / f"{name}.jsonl").write_text(
            "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in recs)
        )
    with replay_server(GROUNDTRUTH, "--token-ids") as t_url, replay_server(GROUNDTRUTH) as p_url:
        r = run("run", str(pipeline_manifest(tmp, t_url, p_url, min_exact=0.5)), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
    r = run(
        "export",
        str(tmp / "run"),
        "--as",
        "speculators",
        "--as",
        "specforge",
        "--as",
        "specforge-conversations",
    )
    assert r.returncode == 0, r.stderr
    export = tmp / "run" / "export"
    rows = pq.read_table(sorted(glob.glob(str(export / "shard-*.parquet")))).to_pylist()
    assert len(rows) == N_TRUTH + N_PAID
    return export, rows, r


def _ours(rows):
    return Counter((tuple(x["input_ids"]), tuple(int(b) for b in x["loss_mask"])) for x in rows)


def test_specforge_prepare_prompt_tasks_gets_our_ids_and_masks(exported):
    from specforge.data.prompt_builder import prepare_prompt_tasks

    export, rows, _ = exported
    tasks = prepare_prompt_tasks(
        export / "specforge.jsonl",
        None,
        chat_template=None,
        max_length=1 << 20,
        is_preformatted=False,
        train_only_last_turn=False,
        cache_dir=None,
        cache_key=None,
        num_proc=None,
    )
    got = Counter(
        (tuple(t["payload"]["input_ids"]), tuple(t["payload"]["loss_mask"])) for t in tasks
    )
    assert got == _ours(rows)


def test_speculators_preprocessing_passes_our_rows_through(exported):
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    export, rows, _ = exported
    ds, _proc = load_and_preprocess_dataset(
        str(TOKENIZERS / "smollm2"),
        [str(export / "speculators.jsonl")],
        seq_length=1 << 20,
        build_dataset_num_proc=1,
    )
    got = Counter((tuple(r["input_ids"].tolist()), tuple(r["loss_mask"].tolist())) for r in ds)
    assert got == _ours(rows)
    assert [int(r["seq_len"]) for r in ds] == [len(r["input_ids"]) for r in ds]


def test_speculators_trainer_dataset_reads_our_save_to_disk_rows(exported):
    import torch
    from speculators.train.data import ArrowDataset

    export, rows, _ = exported
    ds = ArrowDataset(
        max_len=4096,
        datapath=str(export / "speculators-dataset"),
        on_missing="skip",
        hidden_states_dtype=torch.float32,
    )
    assert ds.approx_lengths == [len(x["input_ids"]) for x in rows]  # export order
    for i, x in enumerate(rows):
        assert ds.data[i]["input_ids"].tolist() == x["input_ids"]
        assert ds.data[i]["input_ids"].dtype == torch.int64
        assert ds.data[i]["loss_mask"].tolist() == [int(b) for b in x["loss_mask"]]


def test_specforge_conversations_are_labelled_lossy_and_keep_the_rendered_system(exported):
    from draftdata.formats import get_format
    from draftdata.tokenizers import load_tokenizer

    export, rows, r = exported
    assert "specforge-conversations is lossy" in r.stderr
    recs = [
        json.loads(x) for x in (export / "specforge-conversations.jsonl").read_text().splitlines()
    ]
    assert len(recs) == len(rows)
    system = get_format("chatml").bind(load_tokenizer(TOKENIZERS / "smollm2")).format.default_system
    assert system and "SmolLM" in system  # read from SmolLM2's own chat template
    for rec in recs:
        assert "re-tokenized" in rec["lossy"]
        first = rec["conversations"][0]
        assert first["role"] == "system" and first["content"] == system
        assert rec["conversations"][-1]["role"] == "assistant"
