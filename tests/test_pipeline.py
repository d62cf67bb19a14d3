"""`draftdata run`: ground truth first, the validation gate before any paid request, export."""

from __future__ import annotations

import glob
import json
import sqlite3
from collections import Counter

import datasets
import pyarrow.parquet as pq

from conftest import GROUNDTRUTH
from servers import replay_server, stats
from shared import GT, pipeline_manifest, run


def write_sources(tmp_path, split_pairs=False):
    """truth.jsonl (40 greedy records) and paid.jsonl (30). ``split_pairs``: each holds 10
    answers where SmolLM2 wrote "\n\n" before a digit as one token (1116), which encoding the
    text splits in two, so there are split preferences to learn and to apply."""
    greedy = [r for r in GT if r["id"].endswith("-greedy") and r["source"] != "mtbench_turn2"]
    a, b = greedy[:40], greedy[40:70]
    if split_pairs:
        pair = [r for r in greedy if 1116 in r["output_ids"]]
        rest = [r for r in greedy if 1116 not in r["output_ids"]]
        a, b = pair[:10] + rest[:30], pair[10:20] + rest[30:50]
    for name, recs in (("truth", a), ("paid", b)):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in recs)
        )
    return a, b


def test_run_exports_shards_that_load_and_match_the_manifest(tmp_path):
    a, _ = write_sources(tmp_path)
    with replay_server(GROUNDTRUTH, "--token-ids") as t_url, replay_server(GROUNDTRUTH) as p_url:
        m = pipeline_manifest(tmp_path, t_url, p_url)
        r = run("run", str(m), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        assert stats(p_url)["requests"] == 30
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]
    # the ids server echoes the prompt ids it saw: every one equals our rendering (no drift)
    assert st["truth"]["template_drift"] == {"checked": 40, "differs": 0}
    assert "template_drift" not in st["paid"]
    export = tmp_path / "run" / "export"
    doc = json.loads((export / "manifest.json").read_text())
    files = sorted(glob.glob(str(export / "shard-*.parquet")))
    ds = datasets.load_dataset("parquet", data_files=files, split="train")
    assert len(ds) == doc["counts"]["samples"] == sum(s["rows"] for s in doc["shards"]) == 70
    rows = pq.read_table(files).to_pylist()
    for name, d in doc["datasets"].items():
        mine = [x for x in rows if x["dataset"] == name]
        assert d["samples"] == len(mine)
        assert d["token_sources"] == dict(Counter(x["token_source"] for x in mine))
        assert d["finish_reasons"] == dict(Counter(x["finish_reason"] for x in mine))
    assert doc["datasets"]["truth"]["token_sources"] == {"engine": 40}
    assert doc["datasets"]["paid"]["token_sources"] == {"reconstructed": 30}
    for x in rows:
        assert len(x["input_ids"]) == len(x["loss_mask"])
        assert x["loss_mask"] == [False] * x["prompt_len"] + [True] * (
            len(x["input_ids"]) - x["prompt_len"]
        )
    # the exact engine ids are the ground truth's own
    truth = {r["id"]: r for r in a}
    for x in rows:
        if x["dataset"] == "truth":
            rec = truth[json.loads(x["metadata"])["id"]]
            assert x["input_ids"] == rec["prompt_ids"] + rec["output_ids"]
    v = doc["validation"]
    assert v["n"] == 40 and 0.8 <= v["exact_match_rate"] <= 1.0
    assert doc["gate"]["passed"] and not doc["gate"]["forced"]
    assert doc["tokenizer"]["sha256"] and doc["format"] == {"name": "chatml", "version": "1"}
    assert doc["datasets"]["paid"]["cost_usd"] > 0
    # trainer exports (loaded by the trainers' own code in test_trainer_exports.py)
    r = run("export", str(tmp_path / "run"), "--as", "specforge", "--as", "speculators")
    assert r.returncode == 0, r.stderr
    by_id = {x["id"]: x for x in rows}
    for name in ("specforge.jsonl", "speculators.jsonl"):
        got = [json.loads(x) for x in (export / name).read_text().splitlines()]
        assert len(got) == 70
        for g in got:
            assert g["input_ids"] == by_id[g["id"]]["input_ids"]
            assert g["loss_mask"] == [int(b) for b in by_id[g["id"]]["loss_mask"]]


def paid_exact(tmp_path, truth) -> tuple[int, dict[str, list[int]]]:
    """How many exported samples of the text dataset equal the target's own ids (the ground
    truth the replay server answered from), and every such sample's ids by record id."""
    files = sorted(glob.glob(str(tmp_path / "run" / "export" / "shard-*.parquet")))
    rows = [x for x in pq.read_table(files).to_pylist() if x["dataset"] == "paid"]
    ids = {json.loads(x["metadata"])["id"]: x["input_ids"] for x in rows}
    exact = sum(v == truth[k]["prompt_ids"] + truth[k]["output_ids"] for k, v in ids.items())
    return exact, ids


def test_learned_preferences_are_cross_validated_and_applied(tmp_path):
    """The preferences learned on the run's ground truth are applied to the text dataset: its
    samples, measured against the target's own ids (not against our validation), are exact
    more often than without them, and each sample they change becomes the target's own ids."""
    got = {}
    for learn in (False, True):
        out = tmp_path / str(learn)
        out.mkdir()
        _, b = write_sources(out, split_pairs=True)
        truth = {r["id"]: r for r in b}
        with (
            replay_server(GROUNDTRUTH, "--token-ids") as t_url,
            replay_server(GROUNDTRUTH) as p_url,
        ):
            m = pipeline_manifest(out, t_url, p_url)
            # without preferences a quarter of these answers are not exact: the gate is not
            # what this test measures
            gate = "min_exact = 0.5" + ("\nlearn_prefs = true" if learn else "")
            m.write_text(m.read_text().replace("min_exact = 0.8", gate))
            r = run("run", str(m), "--quiet")
            assert r.returncode == 0, r.stdout + r.stderr
        got[learn] = paid_exact(out, truth)
    prefs = json.loads((tmp_path / "True" / "run" / "prefs.json").read_text())
    assert prefs["kind"] == "draftdata.split_prefs" and prefs["rules"]
    doc = json.loads((tmp_path / "True" / "run" / "export" / "manifest.json").read_text())
    v = doc["validation"]
    assert v["cross_validated"] is True and v["n"] == 40
    assert v["prefs_rules"] == len(prefs["rules"])
    (plain, plain_ids), (learned, learned_ids) = got[False], got[True]
    assert plain_ids.keys() == learned_ids.keys() and len(plain_ids) == 30
    changed = [k for k in plain_ids if plain_ids[k] != learned_ids[k]]
    print(f"exact without preferences {plain}/30, with {learned}/30; changed {changed}")
    assert learned > plain
    assert changed, "the learned preferences changed no sample of the text dataset"
    for k in changed:  # each sample they changed is now the target's own ids
        assert learned_ids[k] == truth[k]["prompt_ids"] + truth[k]["output_ids"], k
    # the run's target is the learned one for every later command too: the text dataset's
    # samples made again by `export` (their rows removed) are the ones the run made
    run_dir = tmp_path / "True" / "run"
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    with db:
        db.execute("DELETE FROM samples WHERE dataset = 'paid'")
        db.execute("DELETE FROM drops WHERE dataset = 'paid' AND stage = 'tokens'")
    db.close()
    r = run("export", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert paid_exact(tmp_path / "True", truth) == (learned, learned_ids)


def test_gate_stops_before_any_paid_request_and_force_is_recorded(tmp_path):
    write_sources(tmp_path)
    with replay_server(GROUNDTRUTH, "--token-ids") as t_url, replay_server(GROUNDTRUTH) as p_url:
        m = pipeline_manifest(tmp_path, t_url, p_url, min_exact=0.999)
        r = run("run", str(m), "--quiet")
        assert r.returncode == 1
        assert "gate failed before any paid request" in r.stderr
        assert "reconstruction vs ground truth" in r.stdout  # the validation report is printed
        assert stats(p_url)["requests"] == 0
        assert stats(t_url)["requests"] == 40
        r = run("run", str(m), "--quiet", "--force")
        assert r.returncode == 0, r.stderr
        assert stats(p_url)["requests"] == 30
    doc = json.loads((tmp_path / "run" / "export" / "manifest.json").read_text())
    assert doc["gate"]["forced"] is True and doc["gate"]["passed"] is False


def test_mispinned_format_stops_before_any_request(tmp_path):
    write_sources(tmp_path)
    fmt = tmp_path / "seed.toml"
    fmt.write_text(
        'name = "chatml-seed"\nversion = "0"\nbase = "chatml"\n'
        '[markers]\nim_end = { text = "<|im_end|>", id = 3 }\n'
    )
    with replay_server(GROUNDTRUTH, "--token-ids") as t_url, replay_server(GROUNDTRUTH) as p_url:
        m = pipeline_manifest(tmp_path, t_url, p_url, fmt=str(fmt))
        r = run("run", str(m), "--quiet")
        assert r.returncode == 2
        assert "pinned id 3 decodes to '<repo_name>', a special token; <|im_end|> is 2" in r.stderr
        assert "Traceback" not in r.stderr
        assert stats(p_url)["requests"] == 0 and stats(t_url)["requests"] == 0
