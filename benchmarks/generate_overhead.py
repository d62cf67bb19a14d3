"""Client overhead of `draftdata generate` against `replay-server` answering instantly.

Builds N synthetic prompts (real ground-truth answers, distinct prompts), serves them with the
project's replay server in its own process, then measures, at each concurrency:

- draftdata: `draftdata generate MANIFEST -q` as a subprocess: the whole pipeline (prompt
  rendering, HTTP, the SQLite ledger written per answer, reconstruction into samples);
- baseline: a minimal asyncio HTTP/1.1 keep-alive client sending the same requests to the same
  server and discarding the answers (what the server alone can do).

Reported: requests/s of each and their ratio, for the whole command (start-up and the tokens
stage included) and for its generation phase alone (from the first request sent to the last
answer committed, read from the ledger's own timestamps: attempts.started_at and
responses.created_at); CPU seconds per request of the draftdata process, and its peak RSS.

    python benchmarks/generate_overhead.py [--prompts 10000] [--concurrency 64 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from replay_throughput import _free_port, _run_raw, _serve

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"


def build(tmp: Path, n: int) -> tuple[Path, Path, list[dict]]:
    recs = [json.loads(line) for line in GT.read_text().splitlines()]
    records, prompts, bodies = [], [], []
    for i in range(n):
        r = recs[i % len(recs)]
        msgs = [{"role": "user", "content": f"[{i}] " + r["messages"][-1]["content"]}]
        records.append(
            {
                "id": f"synthetic-{i}-greedy",
                "source": "bench",
                "messages": msgs,
                "prompt_ids": r["prompt_ids"],
                "output_ids": r["output_ids"],
                "finish_reason": r["finish_reason"],
                "api_view": r["api_view"],
            }
        )
        prompts.append({"id": f"p{i}", "messages": msgs})
        bodies.append({"model": "replay", "messages": msgs, "max_tokens": 256, "temperature": 0.0})
    gt = tmp / "records.jsonl"
    gt.write_text("".join(json.dumps(r) + "\n" for r in records))
    src = tmp / "prompts.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return gt, src, bodies


MANIFEST = """
[run]
name = "bench"
output = "{out}"
[target]
tokenizer = "{tok}"
format = "chatml"
model = "replay"
[backends.api]
kind = "openai"
base_url = "{url}"
concurrency = {conc}
timeout_s = 60
token_ids = "never"
[[datasets]]
name = "bench"
source = "{src}"
reader = "openai"
backend = "api"
turns = "first"
sampling = {{ temperature = 0.0, max_tokens = 256 }}
"""


#: runs argv as its only child and prints the child's CPU seconds and peak RSS (KB)
PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
    "stdout=subprocess.DEVNULL); u = resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(u.ru_utime + u.ru_stime, u.ru_maxrss)"
)


def ledger_size(path: Path) -> int:
    """The ledger's bytes on disk once its write-ahead log is folded in."""
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def generation_s(path: Path) -> float:
    """First request sent to last answer committed, from the ledger's own timestamps."""
    import sqlite3

    db = sqlite3.connect(path)
    (first,) = db.execute("SELECT min(started_at) FROM attempts").fetchone()
    (last,) = db.execute("SELECT max(created_at) FROM responses").fetchone()
    db.close()
    return float(last - first)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--export",
        action="store_true",
        help="also `draftdata export` each run (Parquet shards): its wall time and peak RSS",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="draftdata-bench-"))
    gt, src, bodies = build(tmp, args.prompts)
    port = _free_port()
    server = mp.get_context("spawn").Process(
        target=_serve, args=(str(gt), port, False), daemon=True
    )
    server.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            asyncio.run(_run_raw(url, 1, 1, None))
            break
        except OSError:
            time.sleep(0.1)
    print(
        f"{args.prompts} prompts; server pid {server.pid}; python {sys.version.split()[0]}; "
        f"{os.cpu_count()} cpus"
    )
    for conc in args.concurrency:
        whole, phase = [], []
        for rep in range(args.repeats):
            base_s, ok = asyncio.run(_run_raw(url, args.prompts, conc, bodies))
            assert ok == args.prompts, ok
            out = tmp / f"run-{conc}-{rep}"
            m = tmp / f"m-{conc}-{rep}.toml"
            m.write_text(
                MANIFEST.format(
                    out=out,
                    tok=SHARED / "tokenizers" / "smollm2",
                    url=url + "/v1",
                    conc=conc,
                    src=src,
                )
            )
            t0 = time.perf_counter()
            # through a bare parent: a child's ru_maxrss starts from its parent's peak at fork, and
            # this process holds every request body of the baseline
            got = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    PEAK,
                    sys.executable,
                    "-m",
                    "draftdata",
                    "generate",
                    str(m),
                    "-q",
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            wall = time.perf_counter() - t0
            cpu, peak_mb = float(got[-2]), int(got[-1]) / 1024
            st = json.loads(
                subprocess.run(
                    [sys.executable, "-m", "draftdata", "status", str(m), "--json"],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )["datasets"]["bench"]
            assert st["done"] == args.prompts, st
            rps, base_rps = args.prompts / wall, args.prompts / base_s
            ledger_mb = ledger_size(out / "ledger.sqlite") / 1e6
            gen_rps = args.prompts / generation_s(out / "ledger.sqlite")
            print(
                f"concurrency {conc}: draftdata {rps:.0f} req/s (wall {wall:.1f}s incl. startup "
                f"and samples), baseline raw client {base_rps:.0f} req/s, ratio "
                f"{rps / base_rps:.2f}; generation phase {gen_rps:.0f} req/s, ratio "
                f"{gen_rps / base_rps:.2f}; draftdata CPU {1000 * cpu / args.prompts:.2f} ms/request; "
                f"peak RSS {peak_mb:.0f} MB; ledger {ledger_mb * 1000 / args.prompts:.2f} MB per "
                "1k responses"
            )
            if args.export:
                t0 = time.perf_counter()
                got = subprocess.run(
                    [sys.executable, "-c", PEAK, sys.executable, "-m", "draftdata", "export",
                     str(out)],
                    check=True, capture_output=True, text=True,
                ).stdout.split()  # fmt: skip
                print(
                    f"  export: {time.perf_counter() - t0:.1f} s, CPU {float(got[-2]):.1f} s, "
                    f"peak RSS {int(got[-1]) / 1024:.0f} MB"
                )
            whole.append(rps / base_rps)
            phase.append(gen_rps / base_rps)
        print(
            f"concurrency {conc}: median of {args.repeats}: ratio {statistics.median(whole):.2f} "
            f"(whole command), {statistics.median(phase):.2f} (generation phase)"
        )
    server.terminate()


if __name__ == "__main__":
    main()
