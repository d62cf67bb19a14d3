"""`plan`'s forecast from a pilot, against the run it forecast: the replay server answers with
the SmolLM2 ground truth (real answers of varied lengths), a pilot of 60 prompts is asked and
exported, `plan` forecasts the whole 240, then the run is extended to them and measured."""

from __future__ import annotations

import json
import sqlite3

from conftest import GROUNDTRUTH
from servers import manifest, replay_server
from shared import UNIQUE, run, write_prompts

PRICES = "price_in_per_mtok = 1.0\nprice_out_per_mtok = 4.0"


def test_plan_forecasts_the_run_from_its_pilot_within_a_quarter(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:240])
    with replay_server(GROUNDTRUTH) as url:
        pilot = manifest(tmp_path, url, src, limit=60, turns="first", extra_backend=PRICES)
        none = json.loads(run("plan", str(pilot), "--json").stdout)
        assert none["forecast"] is None  # nothing answered: only the bounds
        assert run("generate", str(pilot), "--quiet").returncode == 0
        assert run("export", str(tmp_path / "run")).returncode == 0
        whole = manifest(tmp_path, url, src, limit=240, turns="first", extra_backend=PRICES)
        r = run("plan", str(whole), "--json")
        f = json.loads(r.stdout)["forecast"]
        text = run("plan", str(whole)).stdout
        assert "forecast from the 60 answers so far" in text and "export forecast" in text
        assert run("generate", str(whole), "--quiet", "--extend").returncode == 0
        assert run("export", str(tmp_path / "run")).returncode == 0
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    (n,) = db.execute("SELECT count(*) FROM work").fetchone()
    pt, ct, cost = db.execute(
        "SELECT sum(prompt_tokens), sum(completion_tokens), sum(cost_usd) FROM responses"
    ).fetchone()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    ledger = sum(p.stat().st_size for p in (tmp_path / "run").glob("ledger.sqlite*"))
    doc = json.loads((tmp_path / "run" / "export" / "manifest.json").read_text())
    shards = sum(x["bytes"] for x in doc["files"] if x["path"].startswith("shard-"))
    measured = {
        "requests": n,
        "prompt_tokens": pt,
        "completion_tokens": ct,
        "cost_usd": cost,
        "ledger_bytes": ledger,
    }
    print({k: (f[k], v) for k, v in measured.items()}, f["export_bytes"], shards)
    assert n == 240 and f["answers_seen"] == 60
    for k, v in measured.items():
        assert abs(f[k] - v) <= 0.25 * v, (k, f[k], v)
    # the export is forecast as a range, from the pilot's own export, and not held to a quarter:
    # a small pilot's file carries a fixed footer and compresses its samples otherwise (here
    # 116-153 KB forecast for 81 KB of shards; the rehearsal's comparison is in BENCHMARKS.md)
    low, high = f["export_bytes"]["shards"]
    assert 0 < low <= high <= 2 * low and shards > 0
