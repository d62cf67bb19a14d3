"""Peak memory of `draftdata reconstruct` (Parquet out) as the input grows: flat means streaming.

The SmolLM2 ground truth (531 records) repeated with distinct ids to each size; the CLI runs
in a child of a bare Python process, whose RUSAGE_CHILDREN peak is the CLI's own.

    python benchmarks/reconstruct_memory.py [--records 10000 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
    "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, nargs="+", default=[10000, 100000])
    args = ap.parse_args()
    lines = [json.loads(x) for x in GT.read_text().splitlines() if x.strip()]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    print("| records | input MB | wall s | peak RSS MB |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.records:
            src = Path(tmp) / f"in-{n}.jsonl"
            with src.open("w") as f:
                for i in range(n):
                    r = lines[i % len(lines)]
                    f.write(json.dumps({**r, "id": f"{r['id']}-{i}"}) + "\n")
            cmd = [sys.executable, "-m", "draftdata", "reconstruct", str(src), "-t",
                   str(SHARED / "tokenizers" / "smollm2"), "-f", "chatml", "-o",
                   str(Path(tmp) / f"out-{n}.parquet")]  # fmt: skip
            t = time.perf_counter()
            kb = int(subprocess.run([sys.executable, "-c", PEAK, *cmd], check=True, env=env,
                                    capture_output=True, text=True).stdout.split()[-1])  # fmt: skip
            wall = time.perf_counter() - t
            print(f"| {n:,} | {src.stat().st_size / 1e6:.0f} | {wall:.1f} | {kb / 1024:.0f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
