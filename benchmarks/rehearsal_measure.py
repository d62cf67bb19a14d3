"""Instruments of the rehearsal (`benchmarks/rehearsal.py`): a command run through a bare
parent that reports its children's CPU and peak RSS (as `generate_overhead.py`'s PEAK does), a
sampler of the command's process tree (CPU, RSS and PSS over time, to split one command's CPU
at a moment and to see the sum of its forked workers), read-only looks at a ledger, and the
report's first paint in headless Chromium through the DevTools protocol."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")

#: runs argv[3:] as its only child (stdout, stderr to files) and writes the child's pid, then
#: its exit status, CPU seconds and peak RSS (KB) as JSON. A bare parent: a child's ru_maxrss
#: starts from its parent's peak at fork, and this one holds nothing
WRAP = (
    "import json, resource, subprocess, sys\n"
    "out, err = open(sys.argv[2] + '.out', 'wb'), open(sys.argv[2] + '.err', 'wb')\n"
    "p = subprocess.Popen(sys.argv[3:], stdout=out, stderr=err)\n"
    "open(sys.argv[1], 'w').write(str(p.pid))\n"
    "rc = p.wait()\n"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "open(sys.argv[2], 'w').write(json.dumps({'rc': rc, 'cpu_s': u.ru_utime + u.ru_stime,"
    " 'maxrss_kb': u.ru_maxrss}))\n"
)


@dataclass
class Sample:
    t: float  # time.time()
    cpu_s: float  # the tree's CPU so far (live processes and the children they reaped)
    rss_kb: int  # sum over the tree
    pss_kb: int  # sum over the tree (shared pages split between the processes sharing them)
    procs: int
    max_rss_kb: int = 0  # the largest process's RSS
    anon_kb: int = 0  # anonymous memory, summed over the tree (not file pages a map brought in)


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, own CPU s, reaped children's CPU s) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = raw[raw.rindex(")") + 2 :].split()
    return int(f[1]), (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK


def _memory(pid: int) -> tuple[int, int, int]:
    """(RSS, PSS, anonymous) KB of a process."""
    rss = pss = anon = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anon = int(line.split()[1])
    return rss, pss, anon


def tree(root: int) -> list[int]:
    """``root``'s descendants (not itself)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                children.setdefault(st[0], []).append(int(d))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


@dataclass
class Run:
    """One command through the bare parent, sampled while it runs."""

    argv: Sequence[str]
    log: Path
    interval: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)
    child: int | None = None
    _proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Run:
        pidfile = Path(str(self.log) + ".pid")
        pidfile.unlink(missing_ok=True)
        self.started = time.time()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", WRAP, str(pidfile), str(self.log), *self.argv],
            start_new_session=True,
        )
        for _ in range(2000):
            if pidfile.exists() and pidfile.read_text():
                self.child = int(pidfile.read_text())
                break
            time.sleep(0.005)
        return self

    def sample(self) -> Sample | None:
        if self.child is None:
            return None
        own = _stat(self.child)
        if own is None:
            return None
        cpu, rss, pss, anon, top, procs = own[1] + own[2], 0, 0, 0, 0, 0
        for pid in [self.child, *tree(self.child)]:
            st = _stat(pid) if pid != self.child else own
            if st is None:
                continue
            if pid != self.child:
                cpu += st[1] + st[2]
            r, p, a = _memory(pid)
            rss, pss, anon, procs = rss + r, pss + p, anon + a, procs + 1
            top = max(top, r)
        s = Sample(time.time(), cpu, rss, pss, procs, top, anon)
        self.samples.append(s)
        return s

    def wait(self, on_sample: Callable[[Run], None] | None = None) -> dict[str, Any]:
        assert self._proc is not None
        while self._proc.poll() is None:
            self.sample()
            if on_sample is not None:
                on_sample(self)
            time.sleep(self.interval)
        self.ended = time.time()
        self.result = json.loads(self.log.read_text()) if self.log.exists() else {"rc": -1}
        self.result["wall_s"] = self.ended - self.started
        return self.result

    def kill(self) -> None:
        """kill -9 the command itself (not the bare parent, which then reports)."""
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)

    def stop_group(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def cpu_at(self, t: float) -> float:
        """The tree's CPU at time ``t``, interpolated between samples."""
        before = [s for s in self.samples if s.t <= t]
        after = [s for s in self.samples if s.t > t]
        if not before:
            return 0.0
        a = before[-1]
        if not after:
            return a.cpu_s
        b = after[0]
        return a.cpu_s + (b.cpu_s - a.cpu_s) * (t - a.t) / max(1e-9, b.t - a.t)

    def peak(self, lo: float = 0.0, hi: float = float("inf")) -> dict[str, int]:
        """Peaks of the samples between two times, KB: the largest process's RSS, and the
        tree's RSS, PSS and anonymous memory."""
        got = [s for s in self.samples if lo <= s.t <= hi]
        return {
            "max_rss_kb": max((s.max_rss_kb for s in got), default=0),
            "rss_kb": max((s.rss_kb for s in got), default=0),
            "pss_kb": max((s.pss_kb for s in got), default=0),
            "anon_kb": max((s.anon_kb for s in got), default=0),
        }

    def series(self, points: int = 300) -> list[list[float]]:
        """The samples, at most ``points`` of them: [s since start, CPU s, largest process
        RSS MB, tree PSS MB, tree anonymous MB, processes]."""
        step = max(1, len(self.samples) // points)
        return [
            [
                round(s.t - self.started, 1),
                round(s.cpu_s, 1),
                round(s.max_rss_kb / 1024),
                round(s.pss_kb / 1024),
                round(s.anon_kb / 1024),
                s.procs,
            ]
            for s in self.samples[::step]
        ]

    def stderr_tail(self, n: int = 2000) -> str:
        p = Path(str(self.log) + ".err")
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    def stdout(self) -> str:
        p = Path(str(self.log) + ".out")
        return p.read_text(errors="replace") if p.exists() else ""


# --------------------------------------------------------------------------- the ledger
def ledger_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection (beside a writer: WAL)."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)


def ledger_count(path: Path, sql: str) -> int:
    if not path.exists():
        return 0
    try:
        db = ledger_ro(path)
        try:
            (n,) = db.execute(sql).fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return 0
    return int(n or 0)


def ledger_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


# --------------------------------------------------------------------------- first paint
PAINT_JS = """JSON.stringify({
  paint: Object.fromEntries(performance.getEntriesByType('paint').map(e => [e.name, e.startTime])),
  nav: (() => { const n = performance.getEntriesByType('navigation')[0];
    return n ? {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd} : null; })(),
  nodes: document.getElementsByTagName('*').length,
  heap: performance.memory ? performance.memory.usedJSHeapSize : null
})"""
SCROLL_JS = """new Promise(r => { const t0 = performance.now();
  window.scrollTo(0, document.body.scrollHeight);
  requestAnimationFrame(() => requestAnimationFrame(() => r(performance.now() - t0))); })"""


async def _cdp_paint(port: int, url: str, timeout_s: float) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        targets: list[dict[str, Any]] = []
        for _ in range(200):
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(f"http://127.0.0.1:{port}/json/list") as r:
                    targets = await r.json()
                if any(t.get("type") == "page" for t in targets):
                    break
            await asyncio.sleep(0.05)
        page = next(t for t in targets if t.get("type") == "page")
        async with s.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))
            events: list[str] = []

            async def call(method: str, **params: Any) -> dict[str, Any]:
                i = next(ids)
                await ws.send_json({"id": i, "method": method, "params": params})
                while True:
                    msg = await ws.receive_json()
                    if msg.get("id") == i:
                        return msg
                    if "method" in msg:
                        events.append(msg["method"])

            await call("Page.enable")
            t0 = time.perf_counter()
            await call("Page.navigate", url=url)
            deadline = t0 + timeout_s
            while "Page.loadEventFired" not in events and time.perf_counter() < deadline:
                msg = await asyncio.wait_for(ws.receive_json(), deadline - time.perf_counter())
                if "method" in msg:
                    events.append(msg["method"])
            load_wall = time.perf_counter() - t0
            got = await call("Runtime.evaluate", expression=PAINT_JS, returnByValue=True)
            doc = json.loads(got["result"]["result"]["value"])
            sc = await call(
                "Runtime.evaluate", expression=SCROLL_JS, awaitPromise=True, returnByValue=True
            )
            doc["scroll_to_end_ms"] = sc["result"]["result"].get("value")
            doc["load_wall_s"] = load_wall
            return doc


def first_paint(chromium: Path, page: Path, timeout_s: float = 300) -> dict[str, Any]:
    """The report's paint timings in headless Chromium (ms from navigation start):
    ``first-paint``, ``first-contentful-paint``, DOMContentLoaded and load, the DOM's node
    count and JS heap, and the time to scroll to the end and paint again."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [
                str(chromium),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "--window-size=1280,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={"HOME": profile, "PATH": "/usr/bin:/bin"},
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            for _ in range(600):
                if port_file.exists() and port_file.read_text().strip():
                    break
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            return asyncio.run(_cdp_paint(port, page.resolve().as_uri(), timeout_s))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def timed(argv: Sequence[str], **kw: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    return time.perf_counter() - t0, r


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    th = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    th.start()
    return th, box
