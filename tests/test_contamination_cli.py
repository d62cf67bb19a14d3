"""``draftdata contamination`` on a manifest and on export shards, and ``export --drop
contaminated``. Expected values come from the prompts' own files: MT-Bench questions (the
FastChat file) and ground-truth records whose ``source`` says where their prompt is from."""

from __future__ import annotations

import json

from conftest import GROUNDTRUTH, PROMPTS
from servers import manifest, replay_server
from shared import run

GT = [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()]


def test_manifest_mtbench_dataset_is_all_flagged_and_sharegpt_none(tmp_path):
    rows = [json.loads(x) for x in (PROMPTS / "mt_bench_question.jsonl").read_text().splitlines()]
    mt = tmp_path / "mt.jsonl"
    mt.write_text("".join(json.dumps(r) + "\n" for r in rows[:12]))
    share = [r for r in GT if r["source"] == "sharegpt" and r["id"].endswith("-greedy")][:12]
    sg = tmp_path / "sg.jsonl"
    sg.write_text(
        "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in share)
    )
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", mt, limit=12, reader="mtbench", name="mt")
    m.write_text(
        m.read_text()
        + f'\n[[datasets]]\nname = "sg"\nsource = "{sg}"\nreader = "openai"\nbackend = "api"\n'
    )
    r = run("contamination", str(m), "--against", "mt-bench", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["datasets"]["mt"]["checked"] == 12 and doc["datasets"]["mt"]["flagged"] == 12
    assert doc["datasets"]["sg"]["checked"] == 12 and doc["datasets"]["sg"]["flagged"] == 0
    # each prompt (both turns of a question) matched a turn of its own question
    assert [f["eval_id"].split(".")[0] for f in doc["datasets"]["mt"]["first"]] == [
        str(r["question_id"]) for r in rows[:10]
    ]
    text = run("contamination", str(m), "--against", "mt-bench")
    assert text.returncode == 0 and "mt: 12 of 12 prompts flagged (mt-bench: 12)" in text.stdout
    bad = run("contamination", str(m), "--against", "mtbench")
    assert bad.returncode != 0 and "mt-bench, humaneval" in bad.stderr


def test_shards_and_export_drop_contaminated(tmp_path):
    recs = [r for r in GT if r["source"] == "mtbench" and r["id"].endswith("-greedy")][:5]
    recs += [r for r in GT if r["source"] == "sharegpt" and r["id"].endswith("-greedy")][:5]
    src = tmp_path / "p.jsonl"
    src.write_text(
        "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in recs)
    )
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=10, turns="first")
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
    r = run("export", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    r = run("contamination", str(tmp_path / "run" / "export"), "--against", "mt-bench", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["datasets"]["gt"]
    assert (d["checked"], d["flagged"]) == (10, 5)
    # no manifest decontaminate: export --drop contaminated checks against every built-in set
    r = run("export", str(tmp_path / "run"), "--drop", "contaminated", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 5
    doc = json.loads((tmp_path / "run" / "export" / "manifest.json").read_text())
    assert doc["filters"] == ["contaminated"] and doc["filtered"] == {"gt": {"contaminated": 5}}
