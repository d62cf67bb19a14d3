"""The seed's job, rehearsed end to end: Kimi K2.5 answers in OpenRouter's shape for eight
datasets, a kill -9 at about 40%, the resume, the export in every trainer layout and the report.

    python benchmarks/rehearsal.py [--prompts 10000] [--json OUT.json] [--keep DIR]

1. **Prompts.** ``rehearsal_data`` writes eight datasets in the shapes of the seed's B1-B8
   (function calling like Glaive and BFCL, code like Magicoder, chat, multi-turn, long-form
   writing) from the real prompt files in ``../shared/data/prompts``, each in its native format,
   and reads them back through draftdata's reader for that format (every prompt distinct).
2. **Answers.** ``rehearsal_server`` (its own process, in its own process group) answers in
   OpenRouter's shape for ``moonshotai/kimi-k2.5``: reasoning + ``reasoning_details``, content,
   tool calls on the function-calling sets, ``usage`` with cost, stated length distributions and
   a latency model (time to first token, tokens/s), streamed as the run asks (a run with a
   budget streams). Its docstring states every distribution and default.
3. **The run.** A manifest with the target's tokenizer (``../shared/tokenizers/kimi-k2``) and
   format ``kimi-k2``, one ``openai`` backend at concurrency 256 with prices and ``[run]
   budget_usd``. ``draftdata generate`` (the run has no ground truth for Kimi, so ``draftdata
   run``'s gate has nothing to measure) is killed with SIGKILL once 40% of the answers are in
   the ledger (polled read-only), then the same command resumes it and makes the samples (the
   tokens stage). Then ``draftdata export``, ``export --as`` each trainer layout on its own,
   ``export`` with every layout at once, ``draftdata report``, and ``draftdata status``.
4. **Measured.** Each command runs through a bare parent that reports its children's CPU and
   peak RSS (``getrusage``), and is sampled every 0.5 s (the process tree's CPU, RSS and PSS,
   forked workers included). The resumed ``generate`` is split into its generation and its
   tokens stage at the last answer's commit (``responses.created_at``), the tree's CPU
   interpolated there. A trainer layout's own time is ``export --as X`` less the plain
   ``export``. Time from resume to the first new request is read from the ledger
   (``attempts.started_at``). The report's first paint is read from headless Chromium through
   the DevTools protocol (``performance`` paint entries).
5. **Checked.** Nothing lost across the kill: the server's served requests = the ledger's
   attempts, less those open at the kill that never reached the server (an attempt is written
   before its request is sent; counted at the kill), no key answered twice, and per dataset
   samples + drops = the answers asked for, in ``status --json`` and in the export's
   ``manifest.json``.

Prints a markdown table; ``--json`` writes every figure. Sizes up to 83,000 prompts work; on 2
cores use 1,000-2,000 to try it and 10,000 to measure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import rehearsal_data
import rehearsal_report
from rehearsal_measure import Run, first_paint, ledger_bytes, ledger_count, ledger_ro, timed
from rehearsal_server import KIMI, Model

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = (
    "speculators",
    "specforge",
    "specforge-conversations",
    "modelopt",
    "nemo-automodel",
    "nemo-automodel-conversations",
)
CHROMIUM = Path("/usr/bin/chromium")
DD = [sys.executable, "-m", "draftdata"]

MANIFEST = """\
[run]
name = "rehearsal"
output = "{out}"
{budget}
[target]
tokenizer = "{tok}"
format = "kimi-k2"
model = "moonshotai/kimi-k2.5"
thinking = true

[backends.openrouter]
kind = "openai"
base_url = "{url}"
concurrency = {concurrency}
timeout_s = 600
price_in_per_mtok = {price_in}
price_out_per_mtok = {price_out}
token_ids = "never"
http = "{http}"
stream = "{stream}"
extra_body = {{ reasoning = {{ enabled = true }}, usage = {{ include = true }} }}
"""
DATASET = """
[[datasets]]
name = "{name}"
source = "{source}"
reader = "{reader}"
backend = "openrouter"
turns = "{turns}"
sampling = {{ temperature = 1.0, top_p = 0.95, max_tokens = {max_tokens} }}
"""


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [
        sys.executable,
        str(Path(__file__).parent / "rehearsal_server.py"),
        "--port",
        "0",
        "--seed",
        str(args.seed),
        "--time-scale",
        str(args.time_scale),
        "--chunk-tokens",
        str(args.chunk_tokens),
    ]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(1200):
        text = log.read_text(errors="replace")
        if "listening on " in text:
            return proc, text.split("listening on ")[1].split()[0]
        if proc.poll() is not None:
            raise SystemExit(f"the answer server did not start:\n{text[-2000:]}")
        time.sleep(0.1)
    raise SystemExit("the answer server did not start in 120 s")


def server_stats(url: str) -> dict[str, Any]:
    base = url.removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/stats", timeout=60) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def status_json(manifest: Path) -> tuple[float, dict[str, Any] | None, str]:
    took, r = timed([*DD, "status", str(manifest), "--json"])
    try:
        return took, json.loads(r.stdout), r.stderr[-500:]
    except ValueError:
        return took, None, (r.stdout + r.stderr)[-1000:]


def in_flight(db: Any, lo: float, hi: float) -> dict[str, Any]:
    """Requests in flight over time between ``lo`` and ``hi``, from the ledger's attempts (a
    request's start and latency): the most at once, the mean over the window from the first
    request to the last answer, and how long after the first request 16, 64 and 256 were in
    flight at once."""
    rows = db.execute(
        "SELECT started_at, latency_s FROM attempts WHERE started_at >= ? AND started_at < ? "
        "AND latency_s > 0",
        (lo, hi),
    ).fetchall()
    if not rows:
        return {}
    ev = sorted([(s, 1) for s, _ in rows] + [(s + lat, -1) for s, lat in rows])
    first, last = ev[0][0], ev[-1][0]
    cur = peak = 0
    area, prev = 0.0, first
    reach: dict[str, float] = {}
    for t, d in ev:
        area += cur * (t - prev)
        prev, cur = t, cur + d
        peak = max(peak, cur)
        for k in (16, 64, 256):
            if cur >= k and str(k) not in reach:
                reach[str(k)] = round(t - first, 1)
    return {
        "max": peak,
        "mean": round(area / max(1e-9, last - first), 1),
        "window_s": round(last - first, 1),
        "s_to_reach": reach,
    }


def phase(
    name: str, run: Run, answers: int, lo: float | None = None, hi: float | None = None
) -> dict[str, Any]:
    """One phase's figures; with ``lo``/``hi`` a part of the command's run, split by time."""
    res = run.result
    if lo is None and hi is None:
        cpu, wall = float(res.get("cpu_s", 0.0)), float(res["wall_s"])
        peak = run.peak()
        # the whole command: its largest process's peak as the kernel counted it
        rss_kb = int(res.get("maxrss_kb", 0))
    else:
        lo = run.started if lo is None else lo
        hi = run.ended if hi is None else hi
        cpu_lo = run.cpu_at(lo) if lo > run.started else 0.0
        cpu_hi = run.cpu_at(hi) if hi < run.ended else float(res.get("cpu_s", 0.0))
        cpu, wall = max(0.0, cpu_hi - cpu_lo), hi - lo
        peak = run.peak(lo, hi)
        rss_kb = peak["max_rss_kb"]  # a part of a command: the largest process, sampled
    pss_kb = peak["pss_kb"]
    return {
        "phase": name,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "answers": answers,
        "cpu_s_per_1k": round(1000 * cpu / answers, 2) if answers else None,
        "peak_rss_mb": round(rss_kb / 1024, 1),
        "peak_pss_tree_mb": round(pss_kb / 1024, 1),
        "peak_anon_tree_mb": round(peak["anon_kb"] / 1024, 1),
        "rss_source": "getrusage" if lo is None and hi is None else "sampled",
        "rc": res.get("rc"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=10000, help="prompts in all (up to 83,000)")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a "
                    "temporary folder, removed at the end)")  # fmt: skip
    ap.add_argument("--kill-at", type=float, default=0.4, help="share of answers at the kill")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-scale", type=float, default=Model.time_scale)
    ap.add_argument("--chunk-tokens", type=int, default=Model.chunk_tokens)
    ap.add_argument("--http", choices=("auto", "lean", "aiohttp"), default="auto")
    ap.add_argument("--no-chromium", action="store_true", help="skip the first-paint check")
    ap.add_argument(
        "--no-budget",
        action="store_true",
        help='leave [run] budget_usd out (answers are still streamed: stream = "always")',
    )
    args = ap.parse_args()
    if not 1 <= args.prompts <= 83_000:
        ap.error("--prompts: give 1 to 83,000")
    if args.keep:
        if args.keep.exists():
            shutil.rmtree(args.keep)
        work = args.keep
        work.mkdir(parents=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="draftdata-rehearsal-"))
    state: dict[str, Any] = {"runs": [], "server": None}
    t_all = time.perf_counter()
    try:
        doc = rehearse(args, work, state)
    finally:
        for r in state["runs"]:
            r.stop_group()
        stop(state["server"])
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    doc["wall_s_total"] = round(time.perf_counter() - t_all, 1)
    print(rehearsal_report.markdown(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"\nwrote {args.json}")


def rehearse(args: argparse.Namespace, work: Path, state: dict[str, Any]) -> dict[str, Any]:
    runs: list[Run] = state["runs"]
    doc: dict[str, Any] = {
        "prompts": args.prompts,
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "time_scale": args.time_scale,
    }
    t0 = time.perf_counter()
    built = rehearsal_data.build(work / "data", args.prompts)
    readers = rehearsal_data.check_readers(built)
    doc["build_s"] = round(time.perf_counter() - t0, 1)
    expected = sum(b.answers for b in built)
    doc["datasets"] = {
        b.name: {
            "reader": b.reader,
            "turns": b.turns,
            "prompts": b.prompts,
            "unique_source_records": b.unique,
            "answers_expected": b.answers,
            "shape": b.shape,
            "read_back": readers[b.name],
        }
        for b in built
    }
    doc["answers_expected"] = expected
    print(f"{args.prompts} prompts, {expected} answers to ask; work folder {work}", flush=True)

    server, url = start_server(args, work / "server.log")
    state["server"] = server
    model = Model(time_scale=args.time_scale, chunk_tokens=args.chunk_tokens)
    # the expected cost at the model's means, with room: the run must not stop on its budget
    budget = max(50.0, 0.03 * expected)
    doc["manifest"] = {
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "budget_usd": None if args.no_budget else budget,
        "price_in_per_mtok": model.price_in,
        "price_out_per_mtok": model.price_out,
        "http": args.http,
    }
    manifest = work / "manifest.toml"
    out = work / "run"
    text = MANIFEST.format(
        out=out,
        budget="" if args.no_budget else f"budget_usd = {budget:.2f}\n",
        stream="always" if args.no_budget else "auto",
        tok=KIMI,
        url=url,
        concurrency=args.concurrency,
        price_in=model.price_in,
        price_out=model.price_out,
        http=args.http,
    )
    for b in built:
        text += DATASET.format(
            name=b.name,
            source=b.path,
            reader=b.reader,
            turns=b.turns,
            max_tokens=args.max_tokens,
        )
    manifest.write_text(text)
    ledger = out / "ledger.sqlite"
    gen = [*DD, "generate", str(manifest), "-q", "--progress-every", "30"]
    phases: list[dict[str, Any]] = []
    doc["phases"] = phases

    # 1. generation until the kill
    kill_at = int(args.kill_at * expected)
    live: dict[str, Any] = {}

    def watch(r: Run) -> None:
        n = ledger_count(ledger, "SELECT count(*) FROM responses")
        if "status_live" not in live and n >= expected * args.kill_at / 2:
            took, st, _ = status_json(manifest)
            live["status_live"] = {"s": round(took, 2), "answers_then": n, "ok": st is not None}
        if n >= kill_at and "killed_at" not in live:
            live["killed_at"] = n
            live["killed_t"] = time.time()
            r.kill()

    print(f"generate, killed at {kill_at} answers ...", flush=True)
    r1 = Run(gen, work / "gen1.json").start()
    runs.append(r1)
    r1.wait(watch)
    at_kill = ledger_count(ledger, "SELECT count(*) FROM responses")
    open_rows = ledger_count(ledger, "SELECT count(*) FROM inflight WHERE state='open'")
    doc["kill"] = {
        "target_answers": kill_at,
        "answers_at_kill_signal": live.get("killed_at"),
        "answers_in_ledger_after_kill": at_kill,
        "open_in_flight_rows": open_rows,
        # every attempt the ledger holds: finished, and still open when the process died
        "attempts_in_ledger_after_kill": ledger_count(ledger, "SELECT count(*) FROM attempts")
        + open_rows,
        "killed": "killed_at" in live,
        "rc": r1.result.get("rc"),
        "server_after_kill": server_stats(url),
    }
    doc["status_live"] = live.get("status_live")
    phases.append(phase("generate until kill -9", r1, at_kill))
    if "killed_at" not in live:
        doc["kill"]["note"] = "generate ended before the kill point: " + r1.stderr_tail(500)

    # 2. the resume: the rest of the answers, then the tokens stage
    print("resume ...", flush=True)
    r2 = Run(gen, work / "gen2.json").start()
    runs.append(r2)
    r2.wait()
    if r2.result.get("rc") != 0:
        doc["resume_error"] = r2.stderr_tail()
    db = ledger_ro(ledger)
    (gen_end,) = db.execute("SELECT max(created_at) FROM responses").fetchone()
    (first_new,) = db.execute(
        "SELECT min(started_at) FROM attempts WHERE started_at >= ?", (r2.started,)
    ).fetchone()
    (first_gen,) = db.execute("SELECT min(started_at) FROM attempts").fetchone()
    answers = db.execute("SELECT count(*) FROM responses").fetchone()[0]
    attempts = dict(
        db.execute("SELECT coalesce(reason, 'ok'), count(*) FROM attempts GROUP BY 1").fetchall()
    )
    (latency_sum,) = db.execute("SELECT sum(latency_s) FROM attempts WHERE ok=1").fetchone()
    flight = {
        "before_kill": in_flight(db, r1.started, r1.ended),
        "after_resume": in_flight(db, r2.started, r2.ended),
    }
    # datasets run one after another: each one's tail (its last request sent to its last
    # answer in) is time the run spends with fewer and fewer requests in flight
    tails = {
        name: {
            "first_request_s": round(a - first_gen, 1),
            "last_request_s": round(b - first_gen, 1),
            "last_answer_s": round(c - first_gen, 1),
            "tail_s": round(c - b, 1),
        }
        for name, a, b, c in db.execute(
            "SELECT dataset, min(started_at), max(started_at), max(started_at + latency_s) "
            "FROM attempts WHERE ok=1 GROUP BY dataset ORDER BY min(started_at)"
        )
    }
    db.close()
    gen_end = float(gen_end or r2.ended)
    phases.append(phase("resume: generation", r2, answers - at_kill, hi=gen_end))
    phases.append(phase("resume: tokens stage", r2, answers, lo=gen_end))
    doc["resume"] = {
        "to_first_new_request_s": round(first_new - r2.started, 2) if first_new else None,
        "generation_window_s": round(gen_end - r2.started, 1),
        "rc": r2.result.get("rc"),
        "stdout_tail": r2.stdout()[-1500:],
    }
    doc["generation"] = {
        "answers": answers,
        "attempts": attempts,
        "first_request_to_last_answer_s": round(gen_end - float(first_gen), 1),
        "sum_answer_latency_s": round(latency_sum or 0, 1),
        "in_flight": flight,
        "datasets": tails,
        "sum_of_tails_s": round(sum(t["tail_s"] for t in tails.values()), 1),
    }
    doc["ledger_after_resume_bytes"] = ledger_bytes(ledger)

    # 3. export, each trainer layout on its own, every layout at once
    print("export ...", flush=True)
    ex = Run([*DD, "export", str(out), "--json"], work / "export.json").start()
    runs.append(ex)
    ex.wait()
    phases.append(phase("export (shards, manifest)", ex, answers))
    plain = phases[-1]["wall_s"]
    plain_cpu = phases[-1]["cpu_s"]
    doc["layouts"] = {}
    for name in LAYOUTS:
        lr = Run([*DD, "export", str(out), "--as", name], work / f"export-{name}.json").start()
        runs.append(lr)
        lr.wait()
        p = phase(f"export --as {name}", lr, answers)
        doc["layouts"][name] = {
            **p,
            "layout_wall_s": round(p["wall_s"] - plain, 2),
            "layout_cpu_s": round(p["cpu_s"] - plain_cpu, 2),
            "error": lr.stderr_tail(600) if p["rc"] != 0 else None,
        }
    every = [a for name in LAYOUTS for a in ("--as", name)]
    ea = Run([*DD, "export", str(out), *every], work / "export-all.json").start()
    runs.append(ea)
    ea.wait()
    phases.append(phase("export, every layout", ea, answers))
    doc["export_bytes"] = sum(
        p.stat().st_size for p in (out / "export").resolve().rglob("*") if p.is_file()
    )

    # 4. the report, and its first paint
    print("report ...", flush=True)
    rp = Run([*DD, "report", str(out), "--json"], work / "report.json").start()
    runs.append(rp)
    rp.wait()
    phases.append(phase("report", rp, answers))
    page = out / "report.html"
    doc["report"] = {"bytes": page.stat().st_size if page.exists() else None}
    if page.exists() and not args.no_chromium and CHROMIUM.exists():
        try:
            doc["report"]["chromium"] = first_paint(CHROMIUM, page)
        except Exception as e:  # a browser that fails is a figure missing, not a failed run
            doc["report"]["chromium"] = {"error": f"{type(e).__name__}: {e}"}

    # 5. status, the counts, and what the server served
    took = []
    for _ in range(3):
        s, st, _ = status_json(manifest)
        took.append(s)
    doc["status_final_s"] = [round(x, 2) for x in took]
    doc["server"] = server_stats(url)
    doc["checks"] = checks(doc, st, out, built)
    size = ledger_bytes(ledger)
    doc["ledger_bytes"] = size
    doc["ledger_bytes_per_answer"] = round(size / max(1, answers))
    doc["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    # each command's samples: [s, CPU s, largest process RSS MB, tree PSS MB, tree anon MB, procs]
    doc["series"] = {r.log.stem: r.series() for r in runs}
    return doc


def checks(doc: dict[str, Any], st: dict[str, Any] | None, out: Path, built: Any) -> dict[str, Any]:
    """Nothing lost across the kill, and every answer a sample or a counted drop."""
    served = doc["server"]["requests"]
    attempts = sum(doc["generation"]["attempts"].values())
    # an attempt is written before its request is sent: the kill can land between the two, and
    # the server never sees that request (nor charges it). Those are counted at the kill, from
    # the ledger's attempts then and the server's requests then; every other attempt was served
    k = doc.get("kill", {})
    at_kill = k.get("attempts_in_ledger_after_kill")
    if at_kill is None:  # a JSON written before the count was kept: no failed attempts in it
        at_kill = (k.get("answers_in_ledger_after_kill") or 0) + (k.get("open_in_flight_rows") or 0)
    unsent = at_kill - k.get("server_after_kill", {}).get("requests", at_kill)
    res: dict[str, Any] = {
        "served_requests": served,
        "ledger_attempts": attempts,
        "attempts_never_sent": unsent,
        "served_equals_attempts": served == attempts,
        "served_equals_attempts_sent": 0 <= unsent <= (k.get("open_in_flight_rows") or 0)
        and served == attempts - unsent,
        # answers the server finished sending that the ledger did not keep: asked (and paid)
        # again after the kill
        "completed_not_kept": doc["server"]["completed"]
        - doc["generation"]["attempts"].get("ok", 0),
    }
    em_path = out / "export" / "manifest.json"
    em = json.loads(em_path.read_text()) if em_path.exists() else {}
    per: dict[str, Any] = {}
    for b in built:
        s = (st or {}).get("datasets", {}).get(b.name, {})
        e = em.get("datasets", {}).get(b.name, {})
        s_sum = s.get("samples", 0) + sum(s.get("drops", {}).values())
        e_sum = e.get("samples", 0) + sum(e.get("drops", {}).values())
        per[b.name] = {
            "answers_expected": b.answers,
            "status_total": s.get("total"),
            "status_samples": s.get("samples"),
            "status_drops": s.get("drops"),
            "export_samples": e.get("samples"),
            "export_drops": e.get("drops"),
            "read_drops": e.get("read_drops"),
            "duplicates": s.get("duplicates", 0),
            "status_ok": s_sum == b.answers == s.get("total"),
            "export_ok": e_sum == b.answers,
            "warnings": s.get("warnings"),
            "errors": s.get("errors"),
            "usage_notes": s.get("usage_notes"),
            "interrupted": s.get("interrupted"),
        }
    res["datasets"] = per
    res["all_ok"] = res["served_equals_attempts_sent"] and all(
        d["status_ok"] and d["export_ok"] and not d["duplicates"] for d in per.values()
    )
    res["cost_usd_ledger"] = (st or {}).get("cost_usd")
    res["cost_usd_server"] = doc["server"].get("cost_usd")
    res["possibly_paid_usd"] = sum(
        d.get("possibly_paid_usd", 0.0) for d in (st or {}).get("datasets", {}).values()
    )
    return res


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_avg_at_start": [round(x, 2) for x in load],
    }


if __name__ == "__main__":
    main()
