"""Peak memory of `reconstruct` and `generate` on an input with one line of N GB (issue 37).

The input: 3 SmolLM2 ground-truth records, one line of ``--gb`` GB (a JSON string of "x", no
newline in it), then one more record. A reader caps each line in bytes while it reads it
(``draftdata.lines``), so the long line is skipped and counted (``line_too_long:4``) and the
peak stays near the command's own baseline. Each command runs in a child of a bare Python
process, whose RUSAGE_CHILDREN peak is the command's own (its largest process). `generate`
runs a manifest whose only dataset is that file against the replay server (started here on a
free port), which answers its 4 usable prompts.

    python benchmarks/long_line.py [--gb 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
TOK = SHARED / "tokenizers" / "smollm2"
PEAK = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, "
    "text=True); print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
    "repr(r.stderr.strip().splitlines()[-1:]))"
)
MANIFEST = """
[run]
name = "long-line"
output = "{out}"

[target]
tokenizer = "{tok}"
format = "chatml"

[backends.api]
kind = "openai"
base_url = "{url}"
token_ids = "never"

[[datasets]]
name = "long"
source = "{src}"
reader = "openai"
backend = "api"
"""


def write_input(path: Path, gb: float) -> None:
    lines = GT.read_text().splitlines(keepends=True)
    block = b"x" * (1 << 24)
    left = int(gb * 1e9)
    with path.open("wb") as f:
        f.write("".join(lines[:3]).encode())
        f.write(b'{"messages": "')
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
        f.write(b'"}\n')
        f.write(lines[3].encode())


def peak(cmd: list[str], env: dict[str, str]) -> tuple[int, float, float, str]:
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", PEAK, *cmd], env=env, capture_output=True, text=True, check=True
    ).stdout.split(maxsplit=2)
    return int(out[0]), int(out[1]) / 1024, time.perf_counter() - t, out[2].strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=2.0)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    draftdata = [sys.executable, "-m", "draftdata"]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "long.jsonl"
        write_input(src, args.gb)
        m = Path(tmp) / "manifest.toml"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [*draftdata, "replay-server", str(GT), "--port", str(port)],
            env=env,
            stderr=subprocess.PIPE,
        )
        assert server.stderr is not None
        while b"listening" not in server.stderr.readline():  # it says so once bound
            pass
        url = f"http://127.0.0.1:{port}/v1"
        m.write_text(MANIFEST.format(out=Path(tmp) / "run", tok=TOK, src=src, url=url))
        cases = {
            "reconstruct (auto jobs)": [
                *draftdata, "reconstruct", str(src), "-t", str(TOK), "-f", "chatml",
                "-o", str(Path(tmp) / "out.parquet"),
            ],
            "reconstruct -j 1": [
                *draftdata, "reconstruct", str(src), "-t", str(TOK), "-f", "chatml",
                "-o", str(Path(tmp) / "out1.parquet"), "-j", "1",
            ],
            "generate": [*draftdata, "generate", str(m), "--quiet"],
        }  # fmt: skip
        print(f"input: {src.stat().st_size / 1e9:.2f} GB, one line of {args.gb} GB")
        print("| command | exit | wall s | peak RSS MB | last stderr line |")
        print("|---|---|---|---|---|")
        try:
            for name, cmd in cases.items():
                rc, mb, wall, last = peak(cmd, env)
                print(f"| {name} | {rc} | {wall:.1f} | {mb:.0f} | {last[:140]} |", flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
