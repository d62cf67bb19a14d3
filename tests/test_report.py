"""The run report, over a real run: prompts answered by the replay server through `draftdata
generate` (a real ledger), validated by `draftdata validate`, then exported to the export contract
(manifest.json + Parquet shards) by the small writer below."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftdata import __version__
from draftdata.errors import InputError
from draftdata.report import build_report, summary
from draftdata.report.figures import usd
from shared import SHARD_SCHEMA, chromium, make_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("report"))


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


def test_screenshot_renders(run_dir: Path, tmp_path: Path) -> None:
    browser = chromium()
    page = build_report(run_dir)
    png = tmp_path / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        r = subprocess.run(
            [
                str(browser),
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
    assert png.exists() and png.stat().st_size > 50_000, r.stderr[-2000:]
