"""The run report, over a real run: prompts answered by the replay server through `draftdata
generate` (a real ledger), validated by `draftdata validate`, then exported to the export contract
(manifest.json + Parquet shards) by the small writer below."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections import Counter
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import GROUNDTRUTH, TOKENIZERS
from draftdata import __version__
from draftdata.errors import InputError
from draftdata.export import shards as export
from draftdata.export.preview import PER_DATASET, write_preview
from draftdata.generate.runner import Runner
from draftdata.report import build_report, summary
from draftdata.report.figures import usd
from draftdata.store import codec
from draftdata.store.runs import manifest_of_run
from draftdata.tokenizers import load_tokenizer
from servers import replay_server
from test_audit_cli import run

GT = [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()]
EVIL = "<script>alert('x')</script>"
# dataset -> (ground-truth sources, prompts, backend)
DATASETS = {
    "chat": (("mtbench", "sharegpt"), 18, "api"),
    "code": (("humaneval", "writingbench"), 12, "vllm"),
    "tools": (("bfcl",), 14, "api"),
}
# the exporter's own schema: the fixture writes shards exactly as `draftdata run` does
SHARD_SCHEMA = export.SHARD_SCHEMA


def _manifest_toml(tmp: Path, url: str, sources: dict[str, Path]) -> Path:
    datasets = "".join(
        f"""
[[datasets]]
name = "{name}"
source = "{sources[name]}"
reader = "openai"
backend = "{backend}"
turns = "first"
sampling = {{ temperature = 0.0, max_tokens = {384 if name == "code" else 256} }}
"""
        for name, (_, _, backend) in DATASETS.items()
    )
    text = f"""
[run]
name = "report-test"
output = "{tmp / "run"}"

[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"
model = "replay"

[backends.api]
kind = "openai"
base_url = "{url}"
concurrency = 4
timeout_s = 10
max_retries = 8
token_ids = "never"
price_in_per_mtok = 0.15
price_out_per_mtok = 0.6

[backends.vllm]
kind = "openai"
base_url = "{url}"
concurrency = 4
timeout_s = 10
max_retries = 1
token_ids = "always"
price_in_per_mtok = 0.05
price_out_per_mtok = 0.2
{datasets}"""
    p = tmp / "manifest.toml"
    p.write_text(text)
    return p


def write_export(run_dir: Path, validation: dict | None, *, shard_rows: int = 25) -> dict:
    """Export the ledger's samples to the contract: Parquet shards + manifest.json."""
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    cfg = json.loads(db.execute("SELECT value FROM meta WHERE key='manifest'").fetchone()[0])
    tok_path = cfg["target"]["tokenizer"]
    tok = load_tokenizer(tok_path)
    rows = []
    for ds, pid, si, turn, src, finish, ids, plen, warns, meta in db.execute(
        "SELECT s.dataset, s.prompt_id, s.sample_idx, s.turn, s.token_source, s.finish_reason, "
        "s.input_ids, s.prompt_len, s.warnings_json, p.metadata_json FROM samples s "
        "JOIN prompts p USING (dataset, prompt_id) ORDER BY s.dataset, p.idx"
    ):
        ids = list(codec.unpack_ids(ids))
        rows.append(
            {
                "id": f"{ds}/{pid}/{si}/{turn}",
                "dataset": ds,
                "prompt_id": pid,
                "sample_idx": si,
                "turn": turn,
                "input_ids": ids,
                "loss_mask": [False] * plen + [True] * (len(ids) - plen),
                "prompt_len": plen,
                "token_source": src,
                "finish_reason": finish,
                "warnings": json.loads(warns),
                "metadata": meta,
            }
        )
    # a hostile string in user-derived data: it must reach the page as text
    rows[0]["warnings"] = [*rows[0]["warnings"], EVIL]
    rows[0]["metadata"] = json.dumps({"note": EVIL})
    export = run_dir / "export"
    export.mkdir(exist_ok=True)
    shards = []
    for i in range(0, len(rows), shard_rows):
        path = export / f"shard-{i // shard_rows:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[i : i + shard_rows], schema=SHARD_SCHEMA), path)
        data = path.read_bytes()
        shards.append(
            {
                "path": path.name,
                "rows": len(rows[i : i + shard_rows]),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    datasets = {}
    for d in cfg["datasets"]:
        name = d["name"]
        mine = [r for r in rows if r["dataset"] == name]
        backend = cfg["backends"][d["backend"]]
        read_drops = json.loads(
            db.execute("SELECT value FROM meta WHERE key=?", (f"read_drops:{name}",)).fetchone()[0]
        )
        datasets[name] = {
            "backend": d["backend"],
            "backend_kind": backend["kind"],
            "ground_truth": name in (validation or {}).get("by_source", {}),
            "sampling": d["sampling"],
            "samples": len(mine),
            "token_sources": dict(Counter(r["token_source"] for r in mine)),
            "finish_reasons": dict(Counter(r["finish_reason"] for r in mine)),
            "drops": dict(
                db.execute(
                    "SELECT reason, count(*) FROM drops WHERE dataset=? AND stage='tokens' "
                    "GROUP BY reason",
                    (name,),
                ).fetchall()
            ),
            "read_drops": read_drops,
            "cost_usd": db.execute(
                "SELECT coalesce(sum(cost_usd), 0) FROM responses WHERE dataset=?", (name,)
            ).fetchone()[0],
        }
    # drops as a real run has them: a few unreadable lines, one with a hostile reason
    datasets["chat"]["read_drops"] = {"malformed_json": 2, EVIL: 1}
    datasets["tools"]["drops"] = {**datasets["tools"]["drops"], "unreconstructable": 1}
    drops: Counter[str] = Counter()
    for d in datasets.values():
        drops.update(d["drops"])
        drops.update(d["read_drops"])
    rate = validation["exact_match_rate"] if validation else None
    manifest = {
        "draftdata_version": __version__,
        "run": cfg["run"]["name"],
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tokenizer": {"path": tok_path, "sha256": tok.sha256, "chat_template_sha256": None},
        "format": {"name": "chatml", "version": "1"},
        "datasets": datasets,
        "counts": {"samples": len(rows), "drops": dict(drops)},
        "validation": validation,
        "gate": {
            "min_exact": 0.9,
            "exact_match_rate": rate,
            "passed": rate is not None and rate >= 0.9,
            "forced": rate is not None and rate < 0.9,
        },
        "shards": shards,
        "cost_usd": round(sum(d["cost_usd"] for d in datasets.values()), 6),
    }
    (export / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("report"))


def make_run(tmp: Path) -> Path:
    """A real run in ``tmp/run``: generated through the replay server (with faults), validated,
    exported, with the exporter's sample preview."""
    sources, truth = {}, []
    for name, (srcs, n, _) in DATASETS.items():
        recs = [r for r in GT if r["id"].endswith("-greedy") and r["source"] in srcs][:n]
        sources[name] = tmp / f"{name}.jsonl"
        sources[name].write_text(
            "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in recs)
        )
        if name != "code":  # "code" has no ground truth: its ids come from the engine
            truth += [{**r, "source": name} for r in recs]
    with replay_server(
        GROUNDTRUTH, "--token-ids", "--faults", "429=0.12,500=0.08", "--seed", "7"
    ) as url:
        m = _manifest_toml(tmp, url, sources)
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
    gt = tmp / "truth.jsonl"
    gt.write_text("".join(json.dumps(r) + "\n" for r in truth))
    val = tmp / "validation.json"
    r = run(
        "validate", str(gt), "-t", str(TOKENIZERS / "smollm2"), "-f", "chatml", "--json", str(val)
    )
    assert val.exists(), r.stdout + r.stderr
    validation = json.loads(val.read_text())
    for exs in validation["examples"].values():  # model text is user-derived too
        exs[0]["text"] += EVIL
    write_export(tmp / "run", validation)
    write_run_preview(tmp / "run")
    return tmp / "run"


def write_run_preview(run_dir: Path) -> Path:
    """The exporter's sample preview (export/preview.json), written as `export_run` writes it."""
    m = manifest_of_run(run_dir)
    m.run.output = str(run_dir.resolve())
    runner = Runner(m, quiet=True)
    try:
        first = {
            d.name: list(islice(runner.ledger.samples(d.name), PER_DATASET)) for d in m.datasets
        }
        return write_preview(first, runner.bound.tokenizer, run_dir / "export")
    finally:
        runner.ledger.close()


def test_report_page(run_dir: Path) -> None:
    manifest = json.loads((run_dir / "export" / "manifest.json").read_text())
    path = build_report(run_dir)
    assert path == run_dir / "report.html"
    page = path.read_text()
    assert not list(run_dir.glob(".report.html*"))  # the temporary file was renamed
    for heading in (
        "Datasets",
        "Lengths",
        "Loss mask",
        "Exactness",
        "Truncation and drops",
        "Cost and throughput",
        "Shards",
        "Prompt length",
        "Response length",
        "Validation against ground truth",
        "Failed attempts by reason",
    ):
        assert f">{heading}</h" in page, heading
    for name, d in manifest["datasets"].items():
        assert f"{name}</span></td>" in page
        assert f"<td class=n>{d['samples']:,}</td>" in page
        assert f'aria-label="{name}: histogram of response length (tokens)"' in page
        assert f'aria-label="{name}: histogram of prompt length (tokens)"' in page
    assert manifest["tokenizer"]["sha256"] in page
    assert f"{sum(d['samples'] for d in manifest['datasets'].values()):,}" in page
    assert "chatml v1" in page and usd(manifest["cost_usd"]) in page
    gate = "PASSED" if manifest["gate"]["passed"] else "FAILED (FORCED)"
    assert gate in page
    assert page.count("<svg") >= 2 * len(manifest["datasets"]) + 4
    # every hostile string arrived as text: in a warning, a drop reason and an example
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") >= 3
    # no network: nothing is loaded from anywhere
    assert not re.search(r"(src|href)=\"?(https?:)?//", page)


def test_report_other_path_and_summary(run_dir: Path, tmp_path: Path) -> None:
    manifest = json.loads((run_dir / "export" / "manifest.json").read_text())
    out = build_report(run_dir, tmp_path / "sub" / "r.html")
    assert out.read_text().startswith("<!DOCTYPE html>")
    text = summary(run_dir)
    lines = text.splitlines()
    assert lines[0].startswith("run report-test")
    assert manifest["tokenizer"]["sha256"][:16] in text
    total = manifest["counts"]["samples"]
    assert f"{total:,} samples in 3 datasets" in text
    for name, d in manifest["datasets"].items():
        row = next(line for line in lines if line.startswith(name + " "))
        assert f" {d['samples']:,} " in row
    assert "read:malformed_json 2" in text
    assert re.search(r"requests: [\d,]+ attempts, [\d,]+ failed \(http_", text)
    assert f"cost {usd(manifest['cost_usd'])}" in text


def test_missing_manifest_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(InputError, match=r"export/manifest.json not found; run `draftdata run"):
        build_report(tmp_path / "run")
    with pytest.raises(InputError, match="draftdata export"):
        summary(tmp_path / "run")
    with pytest.raises(InputError, match="no such run folder"):
        summary(tmp_path / "nope")


def test_missing_shard_names_the_fix(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "export" / "shard-00001.parquet").unlink()
    with pytest.raises(InputError, match=r"shard-00001.parquet \(listed in manifest.json\) not"):
        build_report(copy)


def test_export_only_run_no_ledger_no_validation(tmp_path: Path) -> None:
    """A run folder copied without its ledger, from an API run with no ground truth and a
    forced gate, where one dataset kept no samples and the manifest disagrees with the shards."""
    run_dir, export = tmp_path / "run", tmp_path / "run" / "export"
    export.mkdir(parents=True)
    rows = [
        {
            "id": f"a/{i}",
            "dataset": "api-only",
            "prompt_id": str(i),
            "sample_idx": 0,
            "turn": 0,
            "input_ids": list(range(10 + i)),
            "loss_mask": [False] * 10 + [True] * i,
            "prompt_len": 10,
            "token_source": "reconstructed",
            "finish_reason": "stop",
            "warnings": [],
            "metadata": "{}",
        }
        for i in range(3)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), export / "shard-00000.parquet")
    ds = {
        "backend": "or",
        "backend_kind": "openai",
        "ground_truth": False,
        "cost_usd": 1.5,
        "sampling": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 4096, "seed": 1},
    }
    manifest = {
        "draftdata_version": __version__,
        "run": "api",
        "created_at": "2025-01-01T00:00:00Z",
        "tokenizer": {"path": "t", "sha256": "f" * 64, "chat_template_sha256": "e" * 64},
        "format": {"name": "kimi-k2", "version": "2"},
        "datasets": {"api-only": {**ds, "samples": 5}, "empty": {**ds, "samples": 0}},
        "counts": {"samples": 3, "drops": {}},
        "validation": None,
        "gate": {"min_exact": 0.9, "exact_match_rate": None, "passed": False, "forced": True},
        "shards": [{"path": "shard-00000.parquet", "rows": 3, "bytes": 1, "sha256": "0" * 64}],
        "cost_usd": 3.0,
    }
    (export / "manifest.json").write_text(json.dumps(manifest))
    page = build_report(run_dir).read_text()
    assert "NOT MEASURED (FORCED)" in page and "export was forced" in page
    assert "No ledger.sqlite in the run folder" in page
    assert "the shards hold 3 samples, manifest says 5" in page  # listed under "Check these"
    assert "shard-00000.parquet: " in page and "manifest says 1" in page  # size differs
    assert "kimi-k2 v2" in page and "e" * 64 in page and "empty</span></td>" in page
    text = summary(run_dir)
    assert "gate NOT MEASURED (FORCED)" in text and "3 samples in 2 datasets" in text
    assert "cost $3.0000" in text and "note: ledger.sqlite not found" in text


def test_unreadable_inputs_name_the_fix(run_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    (bad / "export").mkdir(parents=True)
    (bad / "export" / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match=r"not readable JSON .*re-run `draftdata export"):
        summary(bad)
    (bad / "export" / "manifest.json").write_text("[]")
    with pytest.raises(InputError, match="not an export manifest"):
        summary(bad)
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    (copy / "ledger.sqlite").write_bytes(b"this is not sqlite at all" * 100)
    for p in copy.glob("ledger.sqlite-*"):
        p.unlink()
    with pytest.raises(InputError, match="not a readable draftdata ledger"):
        summary(copy)


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium for the screenshot")
def test_screenshot_renders(run_dir: Path, tmp_path: Path) -> None:
    page = build_report(run_dir)
    png = tmp_path / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--window-size=1400,2400",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=False,
            env={**os.environ, "HOME": profile},
        )
    assert png.exists() and png.stat().st_size > 50_000
