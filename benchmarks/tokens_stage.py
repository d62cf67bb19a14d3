"""A run's tokens stage in one process against one worker per core, on the same stored answers.

Takes a run folder that `draftdata generate` filled (for example one that
``benchmarks/generate_overhead.py`` leaves under /tmp/draftdata-bench-*/run-*), removes every
sample and tokens-stage drop, and makes them again with ``--jobs`` workers each (1 first),
``--repeats`` times, in one process. Prints the seconds (median), the ratio, and a digest of the
samples table after each, which must be the same.

    python benchmarks/tokens_stage.py RUN [--jobs 1 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def digest(db_path: Path) -> str:
    db = sqlite3.connect(db_path)
    h = hashlib.sha256()
    for row in db.execute("SELECT * FROM samples ORDER BY 1, 2, 3, 4"):
        h.update(repr(row).encode())
    db.close()
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from draftdata.session import Run
    from draftdata.store.runs import manifest_of_run

    m = manifest_of_run(args.run)
    m.run.output = str(args.run.resolve())
    opened = Run.open(m, write=True, own=False)
    stage = opened.tokens_stage(opened.target, None)
    led = opened.ledger
    times: dict[int, list[float]] = {j: [] for j in args.jobs}
    digests: dict[int, str] = {}
    try:
        for _ in range(args.repeats):
            for jobs in args.jobs:
                for d in m.datasets:
                    with led.tx():
                        led.samples.forget(led.samples.keys(d.name))
                        led.db.execute("DELETE FROM drops WHERE stage='tokens'")
                t = time.perf_counter()
                n = sum(sum(stage.make(d, jobs=jobs).samples.values()) for d in m.datasets)
                times[jobs].append(time.perf_counter() - t)
                digests[jobs] = digest(args.run / "ledger.sqlite")
    finally:
        opened.close()
    base = statistics.median(times[args.jobs[0]])
    for jobs in args.jobs:
        s = statistics.median(times[jobs])
        print(
            f"jobs {jobs}: {n:,} samples in {s:.2f} s (median of {args.repeats}; "
            f"{base / s:.2f}x of jobs {args.jobs[0]}), samples digest {digests[jobs]}"
        )


if __name__ == "__main__":
    main()
