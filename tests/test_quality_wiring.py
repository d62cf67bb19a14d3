"""Issue 29 wired into a run: the quality checks counted on samples and dropped by ``[run] drop``,
``[run] decontaminate`` dropping MT-Bench prompts before they are asked, and ``export --drop``.

The answers are the ones served here (the replay server answers each prompt with the record
written below), so what each check should say is known from what was served: a sentence
repeated to max_tokens (a loop, cut), a plain answer cut at max_tokens, the same answer to two
prompts, a French answer to an English prompt, and a plain finished answer."""

from __future__ import annotations

import json

from conftest import GROUNDTRUTH, PROMPTS
from servers import manifest, replay_server
from shared import SERVED, run, served, with_run


def status_json(m):
    r = run("status", str(m), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def sample_warnings(run_dir):
    import sqlite3

    db = sqlite3.connect(run_dir / "ledger.sqlite")
    rows = db.execute(
        "SELECT p.metadata_json, s.warnings_json FROM samples s JOIN prompts p "
        "USING (dataset, prompt_id)"
    ).fetchall()
    db.close()
    return {json.loads(meta)["id"]: set(json.loads(w)) for meta, w in rows}


QUALITY = {
    "repetition_loop",
    "truncated",
    "empty_answer",
    "think_unclosed",
    "near_duplicate_answer",
    "language_mismatch",
    "count_mismatch",
}


def test_checks_are_counted_warnings_and_export_drop_filters_them(tmp_path):
    src, rec = served(tmp_path)
    with replay_server(rec) as url:
        m = manifest(tmp_path, url, src, limit=len(SERVED), turns="first")
        r = run("generate", str(m))
        assert r.returncode == 0, r.stdout + r.stderr
    assert "py3langid loaded" in r.stderr
    w = {pid: ws & QUALITY for pid, ws in sample_warnings(tmp_path / "run").items()}
    assert w["loop"] == {"repetition_loop", "truncated"}
    assert w["cut"] == {"truncated"}
    assert w["french"] == {"language_mismatch"}
    assert w["ok"] == set()
    # the same answer to two prompts: the second one read is flagged, the first is not
    assert sorted([w["dup-a"], w["dup-b"]], key=len) == [set(), {"near_duplicate_answer"}]
    st = status_json(m)["datasets"]["gt"]
    assert st["samples"] == 6 and st["drops"] == {}
    for name, n in (
        ("truncated", 2),
        ("repetition_loop", 1),
        ("near_duplicate_answer", 1),
        ("language_mismatch", 1),
    ):
        assert st["warnings"][name] == n
    # export --drop: only what passes is written, and the manifest counts what was filtered
    r = run("export", str(tmp_path / "run"), "--drop", "truncated,near_duplicate_answer", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["samples"] == 6 - 3
    doc = json.loads((tmp_path / "run" / "export" / "manifest.json").read_text())
    assert doc["filters"] == ["truncated", "near_duplicate_answer"]
    assert doc["filtered"] == {"gt": {"truncated": 2, "near_duplicate_answer": 1}}
    import pyarrow.parquet as pq

    ids = {
        json.loads(x)["id"]
        for f in sorted((tmp_path / "run" / "export").glob("shard-*.parquet"))
        for x in pq.read_table(f).column("metadata").to_pylist()
    }
    first_dup = next(pid for pid in ("dup-a", "dup-b") if not w[pid])
    assert ids == {"french", "ok", first_dup}
    # an unknown filter is refused with the choices
    r = run("export", str(tmp_path / "run"), "--drop", "loops")
    assert r.returncode != 0 and "repetition_loop" in r.stderr and "contaminated" in r.stderr


def test_manifest_drop_removes_the_samples_and_counts_them(tmp_path):
    src, rec = served(tmp_path)
    with replay_server(rec) as url:
        m = manifest(tmp_path, url, src, limit=len(SERVED), turns="first")
        with_run(m, 'drop = ["repetition_loop", "truncated"]')
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
    st = status_json(m)["datasets"]["gt"]
    # the loop is dropped as a loop (the first check in report order), the cut one as truncated
    assert st["drops"] == {"quality:repetition_loop": 1, "quality:truncated": 1}
    assert st["samples"] == 4
    assert set(sample_warnings(tmp_path / "run")) == {"dup-a", "dup-b", "french", "ok"}


def mtbench_ids():
    rows = [json.loads(x) for x in (PROMPTS / "mt_bench_question.jsonl").read_text().splitlines()]
    return rows


def test_decontaminate_drops_every_mtbench_prompt_before_it_is_asked(tmp_path):
    """A dataset of 10 MT-Bench questions (their own file) and 10 ShareGPT-style ground-truth
    prompts that are not MT-Bench's: every MT-Bench one is dropped when read, none is asked."""
    mt = mtbench_ids()[:10]
    gt = [json.loads(x) for x in GROUNDTRUTH.read_text().splitlines()]
    other = [r for r in gt if r["source"] == "sharegpt" and r["id"].endswith("-greedy")][:10]
    src = tmp_path / "mixed.jsonl"
    lines = [
        {"id": f"mt-{r['question_id']}", "messages": [{"role": "user", "content": r["turns"][0]}]}
        for r in mt
    ] + [{"id": r["id"], "messages": r["messages"]} for r in other]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=20, turns="first")
        with_run(m, 'decontaminate = ["mt-bench"]')
        # the plan counts what the run will drop, before anything is asked
        doc = json.loads(run("plan", str(m), "--json").stdout)
        (ds,) = doc["datasets"]
        assert (ds["prompts"], ds["requests"]) == (10, 10)
        assert ds["read_drops"] == {"contaminated:mt-bench": 10}
        # and a second dataset over the same file holds nothing the first one did not
        twice = tmp_path / "twice.toml"
        block = m.read_text()[m.read_text().index("[[datasets]]") :]
        twice.write_text(m.read_text() + "\n" + block.replace('name = "gt"', 'name = "again"'))
        doc = json.loads(run("plan", str(twice), "--json").stdout)
        again = doc["datasets"][1]
        assert (again["name"], again["prompts"], again["requests"]) == ("again", 0, 0)
        assert again["read_drops"] == {
            "contaminated:mt-bench": 10,
            "duplicate_across_datasets": 10,
        }
        assert any("again" in x and "gives no prompts" in x for x in doc["problems"])
        r = run("generate", str(m))
        assert r.returncode == 0, r.stdout + r.stderr
        from servers import stats

        asked = stats(url)
    assert "10 of 20 prompts dropped as contaminated (mt-bench: 10)" in r.stderr
    st = status_json(m)["datasets"]["gt"]
    assert st["read_drops"] == {"contaminated:mt-bench": 10}
    assert st["total"] == 10  # only the others were queued
    import sqlite3

    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    held = {json.loads(x)["id"] for (x,) in db.execute("SELECT metadata_json FROM prompts")}
    doc = json.loads(
        db.execute("SELECT value FROM meta WHERE key='contamination:gt'").fetchone()[0]
    )
    db.close()
    assert not any(h.startswith("mt-") for h in held)
    assert doc["checked"] == 20 and doc["flagged"] == 10
    # each MT-Bench prompt matched its own first turn, verbatim
    assert sorted(f["eval_id"] for f in doc["first"]) == sorted(f"{r['question_id']}.1" for r in mt)
    assert {f["score"] for f in doc["first"]} == {1.0}
    assert asked["requests"] == 10  # only the others were asked


def test_the_manifest_names_the_checks_the_tokens_stage_has():
    """config cannot import tokens (layering): its list of names is data, checked here."""
    from draftdata.config import QUALITY_CHECK_NAMES
    from draftdata.tokens.quality import QUALITY_CHECKS

    assert tuple(name for name, _ in QUALITY_CHECKS) == QUALITY_CHECK_NAMES
    assert set(QUALITY_CHECK_NAMES) == QUALITY
