"""The fault matrix: every fault the replay server injects, against `draftdata generate`, with
what the server served beside what the ledger recorded.

    python benchmarks/fault_matrix.py [--prompts 200] [--seed 0]

Prints one table row per fault kind: served by the server, and the attempts, retries, drops and
quarantines the ledger holds for it. Loopback only; the run folder is a temporary one."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

#: every fault a run goes on through; ``overlong`` (an answer far past max_tokens) stops its
#: backend at the first answer since issue 25, so it has a test of its own instead
FAULTS = (
    "429=0.05,500=0.05,truncated=0.04,empty=0.04,cut=0.05,slowbody=0.03,401=0.0,"
    "badtools=0.03,strmessage=0.03,nousage=0.05,length=0.03"
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from conftest import GROUNDTRUTH
    from servers import manifest, replay_server, stats

    gt = [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()]
    unique = list({json.dumps(r["messages"]): r for r in gt}.values())[: args.prompts]
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        src = tmp / "p.jsonl"
        src.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in unique))
        with replay_server(
            GROUNDTRUTH, "--faults", FAULTS, "--seed", str(args.seed), "--slow-seconds", "3"
        ) as url:
            m = manifest(tmp, url, src, limit=args.prompts, turns="first")
            m.write_text(m.read_text().replace("timeout_s = 10", "timeout_s = 2"))
            cmd = [sys.executable, "-m", "draftdata", "generate", str(m), "--quiet"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            served = stats(url)
        st = subprocess.run(
            [sys.executable, "-m", "draftdata", "status", str(m), "--json"],
            capture_output=True,
            text=True,
        )
        d = json.loads(st.stdout)["datasets"]["gt"]
        fl = subprocess.run(
            [sys.executable, "-m", "draftdata", "status", str(m), "--failed", "--json"],
            capture_output=True,
            text=True,
        )
        why: dict[str, int] = {}
        for row in json.loads(fl.stdout):
            k = f"{row['state']}:{row['reason'].split(':')[0]}"
            why[k] = why.get(k, 0) + 1
    print(f"faults {FAULTS}; {args.prompts} prompts; generate exit {r.returncode}")
    print(f"server: {served['requests']} requests, faults served {served['faults']}")
    print(
        f"ledger: total {d['total']}, done {d['done']}, failed {d['failed']}, quarantined "
        f"{d['quarantined']}, duplicates {d['duplicates']}, attempts {d['attempts']}, "
        f"samples {d['samples']}"
    )
    print(f"ledger attempt errors: {d['errors']}")
    print(f"ledger drops: {d['drops']}")
    print(f"keys not made into samples, by state and reason: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
