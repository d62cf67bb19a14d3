"""The report's first-hour parts, over the real run of test_report.py: the sample viewer (the
exporter's preview.json, checked against the shards it claims to show), the command line and
manifest, the warnings at the top (truncation, a gate that measured nothing), the capability
probe's refusal kept out of the failures, rates over wall time, and a screenshot of the viewer."""

from __future__ import annotations

import html
import json
import math
import re
import shlex
import shutil
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import pngread
from conftest import TOKENIZERS
from draftdata import __version__
from draftdata.export.preview import MAX_TOKENS, PROMPT_TAIL, preview_sample, window
from draftdata.generate.backends.retry import PROBE_REFUSED
from draftdata.records import Provenance, Sample
from draftdata.report import build_report, summary
from draftdata.report.figures import PROBE_LINE, rate
from draftdata.report.style import CSS, TRAINED_BG
from draftdata.report.viewer import sample_card, tomlish
from draftdata.store import stats
from draftdata.store.ledger import Ledger
from draftdata.store.meta import COMMAND_LINE, MANIFEST
from draftdata.tokenizers import load_tokenizer
from shared import EVIL, PASSED, export_only, make_run, run, screenshot

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ESC_EVIL = html.escape(EVIL, quote=True)
TOK = load_tokenizer(TOKENIZERS / "smollm2")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("viewer"))


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


def section(page: str, sid: str) -> str:
    start = page.index(f"<h2 id={sid}>")
    end = page.find("<h2 ", start + 1)
    return page[start : end if end > 0 else page.index("<footer>")]


def shard_rows(run_dir: Path) -> list[dict[str, Any]]:
    manifest = json.loads((run_dir / "export" / "manifest.json").read_text())
    rows: list[dict[str, Any]] = []
    for s in manifest["shards"]:
        rows += pq.read_table(run_dir / "export" / s["path"]).to_pylist()
    return rows


def preview_of(run_dir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((run_dir / "export" / "preview.json").read_text())
    return doc


# --- the preview, against the shards it claims to show -----------------------------------------
def test_preview_of_a_real_export_shows_the_first_shard_rows(run_dir: Path, tmp_path: Path) -> None:
    copy = copy_run(run_dir, tmp_path)
    r = run("export", str(copy))
    assert r.returncode == 0, r.stdout + r.stderr
    pv, rows = preview_of(copy), shard_rows(copy)
    assert pv["tokenizer_sha256"] == TOK.sha256
    manifest = json.loads((copy / "export" / "manifest.json").read_text())
    assert set(pv["datasets"]) == set(manifest["datasets"])
    cut = 0
    for name, samples in pv["datasets"].items():
        first = [row for row in rows if row["dataset"] == name][:3]
        assert [s["id"] for s in samples] == [row["id"] for row in first]
        for s, row in zip(samples, first, strict=True):
            ids, mask = row["input_ids"], row["loss_mask"]
            start, end = s["start"], s["end"]
            assert (s["length"], s["prompt_len"]) == (len(ids), row["prompt_len"])
            assert [t["id"] for t in s["tokens"]] == ids[start:end]
            assert [t["trained"] for t in s["tokens"]] == mask[start:end]
            assert [t["control"] for t in s["tokens"]] == [
                i in TOK.control_ids for i in ids[start:end]
            ]
            assert [t["text"] for t in s["tokens"]] == [TOK.token_str(i) for i in ids[start:end]]
            assert end - start == min(len(ids), MAX_TOKENS)
            if start or end < len(ids):  # a cut sample keeps the prompt/answer boundary
                cut += 1
                assert start < row["prompt_len"] < end
            assert s["finish_reason"] == row["finish_reason"]
    assert cut, "the run should hold a sample longer than the preview's cap"
    assert any(t["control"] for s in pv["datasets"]["chat"] for t in s["tokens"])


def test_window_keeps_the_prompt_tail_and_the_answer_start() -> None:
    assert window(50, 300) == (0, 300)  # short: all of it
    assert window(1000, 1200) == (800, 1200)  # short answer: all of it, then the prompt's tail
    assert window(50, 1000) == (0, MAX_TOKENS)  # short prompt: all of it, the answer's start
    assert window(300, 1000) == (300 - PROMPT_TAIL, 300 + MAX_TOKENS - PROMPT_TAIL)
    for plen, n in [(0, 900), (400, 401), (399, 2000), (1500, 1501)]:
        a, b = window(plen, n)
        assert b - a == MAX_TOKENS and 0 <= a <= plen <= b <= n


def test_a_cut_sample_says_what_was_cut() -> None:
    ids = TOK.encode("hello there, " * 400)[:1000]
    s = Sample(
        "x/1",
        ids,
        [False] * 500 + [True] * 500,
        500,
        "reconstructed",
        "length",
        Provenance(TOK.sha256, "chatml", "1", __version__),
    )
    card = sample_card(preview_sample(s, TOK), TOK.sha256)
    assert "… 400 earlier prompt tokens not shown …" in card
    assert "… 200 more answer tokens not shown" in card
    assert "showing tokens 400–800 of 1,000" in card
    assert card.count('class="t tr"') == 300 and card.count('class="t"') == 100


# --- the sample viewer on the page -------------------------------------------------------------
def test_viewer_shows_tokens_trained_marks_and_control_chips(run_dir: Path) -> None:
    view = section(build_report(run_dir).read_text(), "samples")
    pv = preview_of(run_dir)
    shown = [s for v in pv["datasets"].values() for s in v]
    assert view.count('<details class="sample"') == len(shown) == 9
    assert view.count('<details class="sample" open>') == 3  # the first of each dataset
    tokens = [t for s in shown for t in s["tokens"]]
    trained = sum(t["trained"] for t in tokens)
    assert trained and view.count('class="t tr') == trained + 1  # + the legend's
    controls = [t for t in tokens if t["control"]]
    assert controls and view.count('<span class="cid">') == len(controls) + 1
    for t in controls:  # a chip with its text and its id
        assert f'{html.escape(t["text"])}<span class="cid">{t["id"]}</span></span>' in view
        assert TOK.token_str(t["id"]) == t["text"]
    for t in tokens[:200]:  # every token's id and repr on hover
        title = f"id {t['id']} · {t['text']!r} · "
        assert f'title="{html.escape(title)}' in view
    for s in shown:
        if s["start"]:
            assert f"… {s['start']:,} earlier prompt tokens not shown …" in view


def test_viewer_escapes_and_says_when_there_is_no_preview(run_dir: Path, tmp_path: Path) -> None:
    copy = copy_run(run_dir, tmp_path)
    path = copy / "export" / "preview.json"
    doc = preview_of(copy)
    s = doc["datasets"]["chat"][0]
    s["id"], s["warnings"] = EVIL, [EVIL]
    s["tokens"][3]["text"] = EVIL
    s["tokens"][4] |= {"text": EVIL, "control": True}
    path.write_text(json.dumps(doc))
    view = section(build_report(copy).read_text(), "samples")
    assert "<script" not in view and view.count(ESC_EVIL) >= 4
    path.unlink()
    page = build_report(copy).read_text()
    assert "has no <code>export/preview.json</code>" in section(page, "samples")
    assert '<details class="sample"' not in page
    path.write_text("{broken")
    page = build_report(copy).read_text()
    assert "export/preview.json is unreadable" in page  # under "Check these"


# --- command line and manifest ------------------------------------------------------------------
def test_command_line_and_manifest(run_dir: Path, tmp_path: Path) -> None:
    led = Ledger.read(run_dir / "ledger.sqlite")
    cfg, argv = led.meta.get(MANIFEST), led.meta.get(COMMAND_LINE) or []
    led.close()
    assert argv[:2] == ["draftdata", "generate"] and argv[2].endswith("manifest.toml")
    page = build_report(run_dir).read_text()
    part = section(page, "run")
    assert f'<pre class="cmd"><code>{html.escape(" ".join(argv))}</code></pre>' in part
    assert f"<dd><code>{html.escape(' '.join(argv))}</code></dd>" in page  # in the header too
    text = html.unescape(re.search(r'<pre class="cfg">(.*?)</pre>', part, re.S)[1])
    # TOML-ish enough to read back as TOML: the manifest, less its unset values
    assert tomllib.loads(text) == _without_none(cfg)
    assert "[run]" in text and "[[datasets]]" in text and "[backends.api]" in text
    assert "[backends]" not in text.splitlines()

    copy = copy_run(run_dir, tmp_path)
    db = sqlite3.connect(copy / "ledger.sqlite")
    cfg["run"]["name"] = EVIL
    cfg["backends"]["api"]["api_key"] = "sk-do-not-show"
    db.execute("UPDATE meta SET value=? WHERE key='manifest'", (json.dumps(cfg),))
    db.execute("UPDATE meta SET value=? WHERE key='command_line'", (json.dumps(["x", EVIL]),))
    db.commit()
    db.close()
    part = section(build_report(copy).read_text(), "run")
    assert "<script" not in part and ESC_EVIL in part  # the run name, in the manifest
    assert f"<code>{html.escape(shlex.join(['x', EVIL]))}</code>" in part  # quoted for a shell
    assert "sk-do-not-show" not in part and "(hidden)" in part


def _without_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _without_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_without_none(v) for v in d]
    return d


def test_tomlish_quotes_odd_keys_and_inlines_nested_tables() -> None:
    doc = {"a b": 1, "t": {"x": [1, 2], "y": None}, "l": [{"k": "v", "s": {"q": True}}]}
    lines = tomlish(doc)
    assert tomllib.loads("\n".join(lines)) == {"a b": 1, "t": {"x": [1, 2]}, "l": [doc["l"][0]]}


# --- warnings at the top -----------------------------------------------------------------------
def alerts_box(page: str) -> str:
    m = re.search(r'<div class="alerts">(.*?)</div>', page, re.S)
    return m[1] if m else ""


def notes_box(page: str) -> str:
    """The amber notes under the quality table (heavy truncation is a quality fact there, not a
    red headline: issue 29)."""
    m = re.search(r'<div class="notes"><strong>Notes</strong>(.*?)</div>', page, re.S)
    return m[1] if m else ""


def test_truncation_warning_for_heavily_truncated_datasets_only(run_dir: Path) -> None:
    finish = {n: Counter() for n in ("chat", "code", "tools")}
    for row in shard_rows(run_dir):
        finish[row["dataset"]][row["finish_reason"]] += 1
    heavy = {n for n, c in finish.items() if c["length"] * 2 > sum(c.values())}
    assert heavy == {"chat", "tools"}  # the run: max_tokens 256 cuts most chat and tools answers
    page = build_report(run_dir).read_text()
    box, text = notes_box(page), summary(run_dir)
    for name, c in finish.items():
        line = f"{name}: {c['length']:,} of {sum(c.values()):,} samples"
        assert (line in box) == (name in heavy), name
        assert line not in alerts_box(page), name
        assert (f"note: {line}" in text) == (name in heavy), name
    assert "max_tokens = 256 may be too low" in box
    assert "Nothing was gated" not in page  # this run's gate measured a rate and passed


@pytest.mark.parametrize(
    ("finishes", "warned"),
    [(["length", "length", "stop", "stop"], False), (["length", "length", "length", "stop"], True)],
)
def test_truncation_warning_needs_more_than_half(
    tmp_path: Path, finishes: list[str], warned: bool
) -> None:
    run_dir = export_only(tmp_path, finishes, PASSED)
    box = notes_box(build_report(run_dir).read_text())
    assert ("d: 3 of 4 samples (75%) were cut off at max_tokens" in box) == warned
    assert ("max_tokens = 4 may be too low" in summary(run_dir)) == warned


NOT_GATED = "no text-only datasets"


@pytest.mark.parametrize(
    ("gate", "badge"),
    [
        # every dataset has exact ids: the gate had nothing to gate (passed, but measured nothing)
        (
            {"exact_match_rate": None, "passed": True, "reason": NOT_GATED, "gated": False},
            "NOT GATED",
        ),
        # an older manifest: no `gated` field, only the reason
        ({"exact_match_rate": 0.97, "passed": True, "reason": NOT_GATED}, "NOT GATED"),
        (
            {"exact_match_rate": None, "passed": False, "reason": "no ground-truth dataset"},
            "NOT MEASURED",
        ),
    ],
)
def test_gate_that_measured_nothing_is_not_a_pass(
    tmp_path: Path, gate: dict[str, Any], badge: str
) -> None:
    run_dir = export_only(tmp_path, ["stop"] * 4, {"min_exact": 0.9, "forced": False, **gate})
    page = build_report(run_dir).read_text()
    assert "PASSED" not in page and "FAILED" not in page
    assert f'<span class="badge none">{badge}</span>' in page
    assert "Nothing was gated" in alerts_box(page)
    text = summary(run_dir)
    assert f"gate {badge}: nothing was gated" in text and "warning: Nothing was gated" in text
    assert "PASSED" not in text


def test_a_measured_gate_still_passes(tmp_path: Path) -> None:
    run_dir = export_only(tmp_path, ["stop"] * 4, PASSED)
    page = build_report(run_dir).read_text()
    assert '<span class="badge pass">PASSED</span>' in page and "Nothing was gated" not in page


# --- the capability probe's refusal ------------------------------------------------------------
def test_probe_refusal_is_not_a_failed_attempt(run_dir: Path, tmp_path: Path) -> None:
    assert stats.PROBE_REFUSED == PROBE_REFUSED  # the ledger's figures know the backend's word
    copy = copy_run(run_dir, tmp_path)
    led = Ledger.read(copy / "ledger.sqlite")
    before = stats.throughput(led, None)
    led.close()
    db = sqlite3.connect(copy / "ledger.sqlite")
    t0 = db.execute("SELECT min(started_at) FROM attempts").fetchone()[0]
    for i, ds in enumerate(("code", "code", "chat")):
        db.execute(
            "INSERT INTO attempts (dataset, prompt_id, sample_idx, turn, backend, ok, reason, "
            "http_status, started_at, latency_s, request, response) "
            "VALUES (?, 'p', 0, 0, 'vllm', 0, ?, 400, ?, 0.01, '{}', ?)",
            (ds, PROBE_REFUSED, t0 + i * 0.01, '{"error": "unknown field return_token_ids"}'),
        )
    db.commit()
    db.close()
    led = Ledger.read(copy / "ledger.sqlite")
    after, code = stats.throughput(led, None), stats.throughput(led, "code")
    led.close()
    assert (after.attempts, after.ok, after.failed_attempts) == (
        before.attempts,
        before.ok,
        before.failed_attempts,
    )
    assert after.errors == before.errors and after.probe_refused == 3 and code.probe_refused == 2
    text = summary(copy)
    assert f"{before.attempts:,} attempts, {before.failed_attempts:,} failed (" in text
    assert PROBE_REFUSED not in text.split(PROBE_LINE)[0]
    assert f"{PROBE_LINE}: 3 attempts, not counted as failed" in text
    page = build_report(copy).read_text()
    errors = page[page.index(">Failed attempts by reason<") :]
    assert f"<td>{PROBE_REFUSED}</td>" not in page
    assert f"<b>{PROBE_LINE}</b>: 3 attempts (chat 1, code 2)" in errors


# --- rates over wall time ----------------------------------------------------------------------
def test_rates_of_a_short_run_are_not_given(run_dir: Path, tmp_path: Path) -> None:
    """50 attempts in 2.5 s: 20 req/s would be a figure about start-up, not the server."""
    copy = copy_run(run_dir, tmp_path)
    db = sqlite3.connect(copy / "ledger.sqlite")
    (t0,) = db.execute("SELECT min(started_at) FROM attempts").fetchone()
    db.execute("UPDATE attempts SET started_at = ? + (id % 50) * 0.05, latency_s = 0.05", (t0,))
    db.commit()
    db.close()
    led = Ledger.read(copy / "ledger.sqlite")
    lt = stats.throughput(led, None)
    led.close()
    assert lt.attempts >= stats.MIN_RATE_ATTEMPTS and lt.wall_s == pytest.approx(2.5)
    assert lt.requests_per_s is None and lt.completion_tokens_per_s is None
    page = build_report(copy).read_text()
    kpis = re.findall(r'<div class="v">([^<]*)</div><div class="l">([^<]*) / s</div>', page)
    assert kpis == [("–", "requests"), ("–", "completion tokens")]
    assert "no rate: only 2.5 s of wall time" in page
    assert "no rates (only 2.5 s of wall time" in summary(copy)


def test_rates_are_over_wall_time_not_in_flight_time(run_dir: Path, tmp_path: Path) -> None:
    copy = copy_run(run_dir, tmp_path)
    db = sqlite3.connect(copy / "ledger.sqlite")
    (mid,) = db.execute("SELECT id FROM attempts ORDER BY started_at LIMIT 1 OFFSET 25").fetchone()
    db.execute("UPDATE attempts SET started_at = started_at + 600 WHERE id >= ?", (mid,))
    db.commit()
    first, last, n = db.execute(
        "SELECT min(started_at), max(started_at + latency_s), count(*) FROM attempts"
    ).fetchone()
    (tokens,) = db.execute("SELECT sum(completion_tokens) FROM responses").fetchone()
    db.close()
    led = Ledger.read(copy / "ledger.sqlite")
    lt = stats.throughput(led, None)
    led.close()
    wall = last - first
    assert wall > 600 and lt.wall_s == pytest.approx(wall)
    assert lt.requests_per_s == pytest.approx(n / wall)  # in-flight time would give ~40/s
    assert lt.completion_tokens_per_s == pytest.approx(tokens / wall)
    page = build_report(copy).read_text()
    head = page[: page.index("<nav>")]
    assert "no rate" not in head
    # the rates the page shows, against the ledger's own counts over its wall time (plain
    # arithmetic here, not the report's own formatting): to three significant figures, or to
    # the unit from 100 up
    kpi = r'<div class="v">([^<]*)</div><div class="l">([^<]*)</div>'
    shown = {label: value for value, label in re.findall(kpi, head)}
    for label, expected in (("requests / s", n / wall), ("completion tokens / s", tokens / wall)):
        assert expected > 0.001, expected
        unit = 1.0 if expected >= 100 else 10.0 ** (math.floor(math.log10(expected)) - 2)
        value = float(shown[label].replace(",", ""))
        assert abs(value - expected) <= unit / 2, (label, shown[label], expected)


def test_rate_rules() -> None:
    t = stats.Throughput(attempts=8, ok=8, first_start=0.0, last_end=100.0, completion_tokens=9)
    assert t.requests_per_s is None and t.rate_note == "only 8 attempts"
    t = stats.Throughput(attempts=20, ok=20, first_start=0.0, last_end=2.5, completion_tokens=9)
    assert t.requests_per_s is None and t.rate_note == "only 2.5 s of wall time"
    t = stats.Throughput(attempts=20, ok=20, first_start=0.0, last_end=400.0)
    assert t.requests_per_s == 0.05 and t.completion_tokens_per_s is None  # no token counts
    assert stats.Throughput().requests_per_s is None
    assert rate(0.05) == "0.05" and rate(0.004) == "0.004" and rate(746.7) == "747"
    assert rate(12.34) == "12.3" and rate(None) == "–"


# --- a screenshot of the sample viewer ----------------------------------------------------------
SHOT = (1200, 900)


def test_screenshot_of_the_sample_viewer(run_dir: Path, tmp_path: Path) -> None:
    view = section(build_report(run_dir).read_text(), "samples")
    doc = tmp_path / "samples.html"
    doc.write_text(
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><style>{CSS}</style>'
        f"</head><body><main>{view}</main></body></html>",
        encoding="utf-8",
    )
    png = tmp_path / "sample-viewer.png"
    err = screenshot(doc, png, SHOT)
    assert png.exists(), err[-2000:]
    assert pngread.size(png) == SHOT
    pixels = pngread.read(png).pixels()
    assert len(pixels) > 50  # text, chips, highlights: not a blank page
    assert max(pixels.values()) < 0.9 * SHOT[0] * SHOT[1]
    trained = tuple(int(TRAINED_BG[i : i + 2], 16) for i in (1, 3, 5))
    chip = (0x3E, 0x4C, 0x59)  # control-token chips
    assert pixels[trained] > 20_000, "no trained-token highlight in view"
    assert pixels[chip] > 1_000, "no control-token chips in view"
