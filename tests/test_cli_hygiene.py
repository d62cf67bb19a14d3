"""The first hour of a new user: every usage error is one line with exit 2, messages keep their
text, the gate's verdict line is true in every case, `plan` checks a run before any request,
`init` writes a manifest that loads, progress shows up in logs, Ctrl-C stops at once."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import GROUNDTRUTH, ROOT, TOKENIZERS
from servers import free_port, manifest, replay_server, stats
from shared import run, sigint_default

GT = [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()]
#: every command and a minimal valid invocation's positional arguments (none: it needs none)
COMMANDS = {
    "formats": [],
    "audit": None,
    "reconstruct": None,
    "validate": None,
    "learn": None,
    "generate": None,
    "status": None,
    "replay-server": None,
    "run": None,
    "report": None,
    "export": None,
    "plan": None,
    "init": [],
    "score": None,
    "hidden-states": None,
    "contamination": None,
    "evaluate": None,
}


def one_line_exit_2(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    return lines[0]


def test_the_command_list_is_complete():
    from draftdata.cli import app

    names = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    assert names == set(COMMANDS)


@pytest.mark.parametrize("cmd", [c for c, a in COMMANDS.items() if a is None])
def test_every_command_without_its_arguments_is_one_line_exit_2(cmd):
    line = one_line_exit_2(run(cmd))
    assert line.startswith(f"error: draftdata {cmd}: Missing")
    assert f"see `draftdata {cmd} --help`" in line


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_every_command_with_a_bad_flag_is_one_line_exit_2(cmd):
    line = one_line_exit_2(run(cmd, "--no-such-flag"))
    assert "No such option: --no-such-flag" in line


def test_no_command_and_a_misspelled_command():
    assert "no command given" in one_line_exit_2(run())
    assert "Did you mean 'audit'?" in one_line_exit_2(run("audti"))


def test_every_command_has_an_example_in_its_help():
    from typer.testing import CliRunner

    from draftdata.cli import app

    runner = CliRunner()  # in this process: a subprocess per command cost ~0.4 s each
    for cmd in COMMANDS:
        r = runner.invoke(app, [cmd, "--help"], prog_name="draftdata", env={"COLUMNS": "100"})
        assert r.exit_code == 0, r.output
        assert "Examples:" in r.output and f"draftdata {cmd}" in r.output, (cmd, r.output)
        assert "<bool>" not in r.output


def test_messages_keep_bracketed_text(tmp_path):
    """Rich markup once ate '[backends.replya]' out of this message."""
    m = tmp_path / "m.toml"
    m.write_text(f"""
[run]
name = "x"
output = "run"
[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"
[backends.replay]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
[[datasets]]
name = "d"
source = "d.jsonl"
reader = "openai"
backend = "replya"
""")
    line = one_line_exit_2(run("plan", str(m)))
    assert "define [backends.replya] or use one of ['replay']" in line


GATE_CASES = {
    "passed": (0.8, 0.9, True, False, "gate passed: exact-match 90.0% ≥ min_exact 80.0%"),
    "failed": (0.9, 0.883, True, False, "gate FAILED: exact-match 88.3% < min_exact 90.0%"),
    "forced": (
        0.9,
        0.883,
        True,
        True,
        "gate FORCED past a failure (--force): exact-match 88.3% < min_exact 90.0%",
    ),
    # every dataset returned exact ids: nothing was gated, and the line says so, not "PASSED"
    "nothing to gate": (
        0.9,
        0.883,
        False,
        False,
        "gate: nothing to gate, every dataset returned exact ids; exact-match 88.3% on ground "
        "truth, for information",
    ),
    "nothing measured": (0.9, None, True, False, "gate FAILED: nothing measured (no ground truth)"),
}


@pytest.mark.parametrize("case", list(GATE_CASES))
def test_the_gate_verdict_line_is_true(case):
    from draftdata.measure.gate import decide

    min_exact, rate, gated, force, line = GATE_CASES[case]
    g = decide(min_exact, rate, gated=gated)
    if force:
        g = g.force()
    assert g.verdict() == line
    if case == "nothing to gate":
        assert "passed" not in g.verdict().lower() and "≥" not in g.verdict()
    assert g.passed == (case in ("passed", "nothing to gate"))


def demo_on_port(tmp_path, name: str, url: str):
    """The demo's manifest ``name`` with its server's base URL (a fixed port, 18931 or 18932)
    replaced by ``url``, beside copies of the demo's prompt files, so that the test does not
    depend on the demo's port being free. Nothing else of the demo's manifest changes."""
    import shutil

    demo = ROOT / "examples" / "demo"
    text = (demo / name).read_text()
    ports = set(re.findall(r"http://127\.0\.0\.1:1893[12]/v1", text))
    assert len(ports) == 1, f"{name} should name one demo server (18931 or 18932): {ports}"
    here = tmp_path / "examples" / "demo"  # its relative output, ../../runs, stays in tmp_path
    here.mkdir(parents=True)
    for data in demo.glob("*.json*"):  # the prompt files its datasets name, relative to it
        shutil.copy(data, here / data.name)
    copy = here / name
    copy.write_text(text.replace(ports.pop(), url))
    return copy


def test_plan_of_the_demo_prints_the_table_and_sends_nothing(tmp_path):
    """`draftdata plan examples/demo/manifest-serve.toml` with a request-counting server where the
    demo's `transformers serve` would be (on a free port instead of the demo's 18931)."""
    served = tmp_path / "gt.jsonl"
    served.write_text("".join(json.dumps(r) + "\n" for r in GT[:5]))
    with replay_server(served) as url:
        demo = demo_on_port(tmp_path, "manifest-serve.toml", url)
        r = run("plan", str(demo), "--json")
        assert stats(url)["requests"] == 0
    doc = json.loads(r.stdout)
    rows = {d["name"]: d for d in doc["datasets"]}
    assert set(rows) == {"mtbench", "bfcl", "sharegpt"}
    assert rows["mtbench"]["ground_truth"] and rows["mtbench"]["requests"] == 24  # 12 x 2 turns
    assert (rows["bfcl"]["requests"], rows["sharegpt"]["requests"]) == (8, 12)
    assert all(d["prompt_tokens"] > 0 for d in rows.values())
    from draftdata.config import load_manifest

    per = load_manifest(demo).dataset("sharegpt").sampling.max_tokens
    assert rows["sharegpt"]["completion_tokens_max"] == 12 * per
    assert "mtbench" in doc["gate"] and "min_exact 0.8" in doc["gate"]
    assert doc["problems"] == [] and r.returncode == 0
    table = run("plan", str(demo))
    for name in ("mtbench", "bfcl", "sharegpt", "gate:", "cost:"):
        assert name in table.stdout


def test_plan_of_the_demo_with_its_vllm_server_down_names_the_gate_it_will_have(tmp_path):
    """The default demo (examples/demo/manifest.toml) names its server (``server = "vllm"``):
    before run_demo.py starts it, `plan` says the server does not answer and still says which
    datasets' engine ids will feed the gate, instead of "nothing to gate on". The server is
    down on a free port where nothing listens, not on the demo's 18932, which may be in use."""
    dead = free_port()
    r = run("plan", str(demo_on_port(tmp_path, "manifest.toml", f"http://127.0.0.1:{dead}/v1")))
    assert r.returncode == 1, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert "measured on the server's own ids of mtbench (24, vllm), bfcl (8, vllm)" in out, out
    assert "before sharegpt sends a request" in out
    assert "does not answer" in out and "is the server running?" in out
    assert "nothing to gate on" not in out


def test_plan_names_every_problem_before_a_request(tmp_path, monkeypatch):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in GT[:3]))
    dead = free_port()  # nothing listens here
    m = manifest(
        tmp_path,
        f"http://127.0.0.1:{dead}/v1",
        src,
        limit=3,
        extra_backend='api_key_env = "DRAFTDATA_TEST_NO_SUCH_KEY"\nprice_in_per_mtok = 1.0\n'
        "price_out_per_mtok = 2.0",
    )
    r = run("plan", str(m))
    assert r.returncode == 1
    assert "DRAFTDATA_TEST_NO_SUCH_KEY is not set" in r.stdout
    assert f"127.0.0.1:{dead} does not answer" in r.stdout
    assert "nothing to gate on" in r.stdout
    assert not (tmp_path / "run").exists()  # a plan writes nothing


def test_unset_key_and_dead_server_are_refused_before_any_request(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in GT[:3]))
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(
            tmp_path, url, src, limit=3, extra_backend='api_key_env = "DRAFTDATA_TEST_NO_SUCH_KEY"'
        )
        line = one_line_exit_2(run("generate", str(m), "--quiet"))
        assert "DRAFTDATA_TEST_NO_SUCH_KEY is not set" in line
        assert stats(url)["requests"] == 0
    m = manifest(tmp_path, f"http://127.0.0.1:{free_port()}/v1", src, limit=3)
    line = one_line_exit_2(run("generate", str(m), "--quiet"))
    assert "does not answer" in line and "nothing was sent" in line
    ledger = tmp_path / "run" / "ledger.sqlite"  # not 90 refused attempts
    if ledger.exists():
        with sqlite3.connect(ledger) as db:
            assert db.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0


def test_init_writes_a_manifest_that_loads(tmp_path):
    from draftdata.config import load_manifest

    for backend in ("openai", "hf"):
        out = tmp_path / f"{backend}.toml"
        r = run("init", "--backend", backend, "-o", str(out))
        assert r.returncode == 0, r.stderr
        m = load_manifest(out)
        assert m.datasets[0].backend in m.backends
        assert m.backends[m.datasets[0].backend].kind == backend
    assert "exists" in one_line_exit_2(run("init", "-o", str(tmp_path / "hf.toml")))


def test_an_existing_ground_truth_file_is_the_gates_evidence(tmp_path):
    """A run with only a text backend: [run] ground_truth names the evidence."""
    greedy = [r for r in GT if r["id"].endswith("-greedy") and r["source"] == "mtbench"]
    evidence = tmp_path / "gt.jsonl"
    evidence.write_text("".join(json.dumps(r) + "\n" for r in greedy[:20]))
    src = tmp_path / "p.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in greedy[20:26]
        )
    )
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(
            tmp_path,
            url,
            src,
            limit=6,
            turns="first",
            budget=f'ground_truth = "{evidence}"\nmin_exact = 0.5',
        )
        r = run("run", str(m), "--quiet", "--json")
        assert r.returncode == 0, r.stderr
        assert stats(url)["requests"] == 6
    doc = json.loads(r.stdout)
    assert doc["validation"]["n"] == 20
    assert doc["gate"]["passed"] and doc["gate_verdict"].startswith("gate passed: exact-match")


def test_progress_lines_without_a_terminal(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in GT[:12]))
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=12, turns="first")
        r = run("generate", str(m), "--quiet", "--progress-every", "0.01")
        assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if re.match(r"^gt: \d+/\d+ \(\d+%\) · ", ln)]
    # how many lines come between the first and the last depends on the machine's speed: only
    # the first (at the start), the last (at the end) and their order are asserted
    assert lines, r.stderr
    first = re.match(r"^gt: 0/(\d+) \(0%\) · ", lines[0])  # the first line, at the start
    assert first, lines[0]
    assert lines[-1].startswith(f"gt: {first[1]}/{first[1]} (100%) · ")  # the last, at the end
    done = [int(re.match(r"^gt: (\d+)/", ln)[1]) for ln in lines]
    assert done == sorted(done)
    assert all(" · errors " in ln and " · ETA " in ln for ln in lines)
    # nothing is left: no positive ETA, whether or not the run was long enough for a rate
    assert re.search(r" · ETA (0m00s|–)$", lines[-1]), lines[-1]


def test_ctrl_c_stops_at_once_and_keeps_what_is_stored(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in GT[:40]))
    with replay_server(GROUNDTRUTH, "--faults", "slow=0.5", "--slow-seconds", "60") as url:
        m = manifest(tmp_path, url, src, limit=40, turns="first")
        proc = subprocess.Popen(
            [sys.executable, "-m", "draftdata", "generate", str(m), "--quiet"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=sigint_default,
        )
        ledger = tmp_path / "run" / "ledger.sqlite"
        deadline = time.time() + 300
        while time.time() < deadline and stats(url)["requests"] < 10:  # wait until it is busy
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        # it left the slow answers in flight (each held 60 s) instead of waiting for them: the
        # server sees their connections close (a client that waited would hang up on none)
        deadline = time.time() + 30
        while stats(url)["hung_up"] == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert stats(url)["hung_up"] >= 1
    assert proc.returncode == 130, repr(err)
    lines = [ln for ln in err.splitlines() if ln.startswith(("interrupted", "error"))]
    assert lines == [
        "interrupted: everything answered so far is in the ledger; run the same command again "
        "to resume"
    ]
    assert "Traceback" not in err
    assert ledger.exists()


def test_the_version_is_the_one_pip_installed():
    """draftdata writes its version as a constant (reading the package metadata cost 80 ms of
    every start-up); pip's record of the installed project is the independent source."""
    from importlib.metadata import version

    import draftdata

    assert draftdata.__version__ == version("draftdata")
    r = run("--version")
    assert r.returncode == 0 and draftdata.__version__ in r.stdout, r.stdout + r.stderr
