"""Durations come from a monotonic clock (issue 53, item 9). On 42e677c a wall clock moved back a
day and then forward ten years during a run stored ``latency_s`` from -86,400 to 315,446,400,
and the progress line read "0.0 req/s over 315360011 s". Here the run's own ``time.time`` jumps
(a subprocess with it patched: draftdata's code is not touched), the answers are timed by a
server of the tests' own, and every stored duration must be what it took."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys

from hostile import Hostile, honest
from test_hostile_servers import manifest, prompts

#: ``draftdata generate`` with a wall clock that goes back a day after 40 reads of it and
#: forward ten years after 120
JUMPING = """
import runpy, sys, time
real = time.time
reads = [0]
def jumping():
    reads[0] += 1
    n = reads[0]
    return real() + (0 if n < 40 else -86400 if n < 120 else 10 * 365 * 86400)
time.time = jumping
sys.argv = ["draftdata", "generate", sys.argv[1]]
runpy.run_module("draftdata", run_name="__main__")
"""


def test_a_wall_clock_that_jumps_changes_no_duration(tmp_path):
    server = Hostile(lambda req, i, n: honest(), token_s=0.002)
    src = prompts(tmp_path / "p.jsonl", 24)
    with server.running() as url:
        m = manifest(tmp_path, url, {"d": src}, concurrency=2)
        r = subprocess.run(
            [sys.executable, "-c", JUMPING, str(m)], capture_output=True, text=True, timeout=600
        )
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    latencies = [x for (x,) in db.execute("SELECT latency_s FROM attempts")]
    db.close()
    assert len(latencies) == 24
    assert all(0 <= x < 60 for x in latencies), sorted(latencies)[:3] + sorted(latencies)[-3:]
    spans = [float(s) for s in re.findall(r"over (\d+(?:\.\d+)?) s", r.stderr)]
    assert spans and all(s < 600 for s in spans), r.stderr
