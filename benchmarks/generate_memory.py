"""How `draftdata generate`'s memory grows with the answers it has taken: the generation alone, in
this process, against the rehearsal's answer server (Kimi K2.5 in OpenRouter's shape, the
rehearsal's eight datasets), the peak RSS read at answer counts polled from the ledger.

    python benchmarks/generate_memory.py [--prompts 8000] [--at 1000 3000 5000 7000 9000]
        [--trace]

``--trace`` runs tracemalloc (10 frames) and prints, between the first and last marks, where
live Python memory grew. Issue 40's finding: ~10 KB an answer of RSS that is not live Python
memory (BENCHMARKS.md, the 83k rehearsal).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import resource
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import rehearsal
import rehearsal_data
from rehearsal_server import Model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8000)
    ap.add_argument("--at", type=int, nargs="+", default=[1000, 3000, 5000, 7000, 9000])
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--time-scale", type=float, default=0.005)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="draftdata-genmem-"))
    built = rehearsal_data.build(work / "data", args.prompts)
    ns = argparse.Namespace(seed=0, time_scale=args.time_scale, chunk_tokens=Model.chunk_tokens)
    server, url = rehearsal.start_server(ns, work / "server.log")
    try:
        run(work, built, url, args)
    finally:
        rehearsal.stop(server)
        shutil.rmtree(work, ignore_errors=True)


def rss_parts() -> str:
    """The current RSS split as the kernel counts it: anonymous, file-backed, shared memory."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
        )
    except OSError:
        return ""
    keys = ("RssAnon", "RssFile", "RssShmem")
    parts = [f"{k} {int(fields[k].split()[0]) // 1024} MB" for k in keys if k in fields]
    return ", ".join([*parts, heap()])


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap() -> str:
    """glibc's own count: bytes malloc holds in use, free inside its heaps, and in mmaps."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return ""
    mb = 1 << 20
    return (
        f"malloc in use {m.uordblks // mb} MB, free {m.fordblks // mb} MB "
        f"({m.ordblks} chunks), mmapped {m.hblkhd // mb} MB"
    )


def run(work: Path, built: list, url: str, args: argparse.Namespace) -> None:  # type: ignore[type-arg]
    from draftdata.config import load_manifest
    from draftdata.generate.runner import Runner
    from draftdata.session import Run

    model = Model()
    text = rehearsal.MANIFEST.format(
        out=work / "run",
        budget="budget_usd = 100000\n",
        stream="auto",
        tok=rehearsal.KIMI,
        url=url,
        concurrency=256,
        price_in=model.price_in,
        price_out=model.price_out,
        http="auto",
    )
    for b in built:
        text += rehearsal.DATASET.format(
            name=b.name, source=b.path, reader=b.reader, turns=b.turns, max_tokens=16384
        )
    (work / "manifest.toml").write_text(text)
    if args.trace:
        tracemalloc.start(10)
    opened = Run.open(load_manifest(work / "manifest.toml"), write=True)
    r = Runner(opened, quiet=True)
    marks = sorted(args.at)
    snaps: list[tuple[int, tracemalloc.Snapshot | None]] = []

    def watch() -> None:
        while marks:
            try:
                db = sqlite3.connect(f"file:{work}/run/ledger.sqlite?mode=ro", uri=True)
                (k,) = db.execute("SELECT count(*) FROM responses").fetchone()
                db.close()
            except sqlite3.Error:
                k = 0
            if k >= marks[0]:
                marks.pop(0)
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
                traced = tracemalloc.get_traced_memory()[0] / 1e6 if args.trace else 0.0
                snaps.append((k, tracemalloc.take_snapshot() if args.trace else None))
                print(
                    f"{k:,} answers: peak RSS {peak} MB; live Python {traced:.0f} MB; {rss_parts()}",
                    flush=True,
                )
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    asyncio.run(r.generate())
    print(f"generate returned: {rss_parts()}", flush=True)
    r.close()
    opened.close()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print(f"closed, collected, trimmed: {rss_parts()}", flush=True)
    if args.trace and len(snaps) >= 2 and snaps[0][1] is not None and snaps[-1][1] is not None:
        for st in snaps[-1][1].compare_to(snaps[0][1], "traceback")[:8]:
            print(f"--- {st.size_diff / 1e6:+.1f} MB ({st.count_diff:+} blocks)")
            for line in st.traceback.format()[-8:]:
                print("   ", line)


if __name__ == "__main__":
    main()
