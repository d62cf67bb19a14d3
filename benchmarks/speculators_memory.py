"""Peak RSS of writing the speculators ``save_to_disk`` dataset, against ``save_to_disk`` itself.

Each side runs in a process of its own over the same stream of N samples of L tokens (ids of no
tokenizer: only their count matters) and reports its own peak RSS (VmHWM) and wall time:

- draftdata: ``export.trainers.speculators.write_dataset`` (shards written with ``datasets``'
  ``ArrowWriter`` as the samples come);
- baseline: what the export did before, and what ``datasets`` offers: the rows streamed into an
  Arrow file in batches of the same size, then ``Dataset.from_file`` and ``save_to_disk``
  (which reads its memory-mapped source whole).

    python benchmarks/speculators_memory.py [--samples 2000] [--tokens 5000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
from pathlib import Path
side, n, length, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
from draftdata.records import Provenance, Sample
prov = Provenance("x", "chatml", "1", "0")
def rows():
    for i in range(n):
        yield Sample(f"s{i}", list(range(i, i + length)), [j > length // 4 for j in range(length)],
                     length // 4, "engine", "stop", prov)
t = time.perf_counter()
if side == "draftdata":
    from draftdata.export.trainers.speculators import write_dataset
    write_dataset(rows(), out)
else:
    import datasets, pyarrow as pa
    from draftdata.export.trainers.speculators import BATCH_TOKENS, pretokenized_row
    datasets.disable_progress_bars()
    schema = pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int64())),
                        ("loss_mask", pa.list_(pa.int64())), ("seq_len", pa.int64())])
    out.mkdir(parents=True)
    arrow = out / "rows.arrow"
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
        batch, tokens = [], 0
        for s in rows():
            r = pretokenized_row(s); r["seq_len"] = len(s.input_ids); batch.append(r)
            tokens += len(s.input_ids)
            if tokens >= BATCH_TOKENS or len(batch) >= 1024:
                w.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema)); batch, tokens = [], 0
        w.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
    ds = datasets.Dataset.from_file(str(arrow))
    ds.set_format(type="torch", columns=["input_ids", "loss_mask", "seq_len"], output_all_columns=True)
    ds.save_to_disk(str(out / "dataset"))
wall = time.perf_counter() - t
peak = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0]
print(json.dumps({"wall_s": wall, "peak_mb": int(peak) // 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=5000)
    a = ap.parse_args()
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("baseline", "draftdata"):
            r = subprocess.run(
                [sys.executable, "-c", CHILD, side, str(a.samples), str(a.tokens), str(Path(tmp) / side)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            got[side] = json.loads(r.stdout.splitlines()[-1])
    total = a.samples * a.tokens
    print(f"{a.samples:,} samples x {a.tokens:,} tokens = {total / 1e6:.1f}M tokens")
    print("| side | peak RSS MB | wall s |\n| --- | ---: | ---: |")
    for side, v in got.items():
        print(f"| {side} | {v['peak_mb']:,} | {v['wall_s']:.1f} |")
    print(
        f"peak RSS draftdata / baseline: {got['draftdata']['peak_mb'] / got['baseline']['peak_mb']:.2f}"
    )


if __name__ == "__main__":
    main()
