"""Export a finished run for ModelOpt and NeMo Automodel, load the files with the trainers' own
code (``nvidia-modelopt`` 0.47.0 ``OfflineSupervisedDataset`` + ``EagleOfflineDataCollator``,
``nemo-automodel`` 0.7.0 ``_stack_batch`` and ``build_packed_eagle3_dataset`` + ``_pack_collate``)
and count the samples whose ``input_ids`` and ``loss_mask`` come back equal to the export's own
Parquet shards (``RUN/export/shard-*.parquet``). The loader calls are the ones
``tests/test_trainer_modelopt_nemo.py`` makes: the ids-only ModelOpt files are given stand-in
hidden states (``draftdata.export.trainers.modelopt.offline_record``, random bf16, H = 8) in a
temporary folder, since ModelOpt's offline dataset reads ``hidden_states`` from every file.

    python benchmarks/trainer_loaders.py [RUN] [--json OUT]

RUN defaults to ``runs/demo`` (``make demo``). Exits 1 if any sample comes back changed.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

Pair = tuple[list[int], list[int]]

#: hidden size of the stand-in hidden states (the ids and masks are under test, not them)
H = 8


def export(run: Path) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "draftdata", "export", str(run)]
    subprocess.run([*cmd, "--as", "modelopt", "--as", "nemo-automodel"], check=True)
    return time.perf_counter() - t0


def reference(export_dir: Path) -> dict[str, Pair]:
    import pyarrow.parquet as pq

    shards = sorted(glob.glob(str(export_dir / "shard-*.parquet")))
    if not shards:
        raise SystemExit(f"no shard-*.parquet under {export_dir}")
    rows = pq.read_table(shards, columns=["id", "input_ids", "loss_mask"]).to_pylist()
    return {r["id"]: (list(r["input_ids"]), [int(b) for b in r["loss_mask"]]) for r in rows}


def modelopt(export_dir: Path, ref: dict[str, Pair]) -> dict[str, bool]:
    """Per sample id: ids and mask unchanged through ``OfflineSupervisedDataset`` (its item) and
    ``EagleOfflineDataCollator`` (its padded batch)."""
    import torch
    from modelopt.torch.speculative.eagle.utils import (
        EagleOfflineDataCollator,
        OfflineSupervisedDataset,
    )

    from draftdata.export.trainers import modelopt as mo

    files = sorted((export_dir / "modelopt").glob("*.pt"))
    ok: dict[str, bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp)
        ids: list[str] = []
        for f in files:
            rec = torch.load(f, weights_only=True)
            n = len(rec["input_ids"])
            ids.append(rec["id"])
            torch.save(
                mo.offline_record(
                    torch,
                    rec["id"],
                    rec["input_ids"].tolist(),
                    [bool(b) for b in rec["loss_mask"].tolist()],
                    torch.randn(n, H, dtype=torch.bfloat16),
                    torch.randn(n, 3 * H, dtype=torch.bfloat16),
                ),
                full / f.name,
            )
        paths = sorted(str(p) for p in full.glob("*.pt"))
        ds = OfflineSupervisedDataset(paths, answer_only_loss=True)
        items = [ds[i] for i in range(len(ds))]
        train_len = max(len(it["input_ids"]) for it in items)
        batch = EagleOfflineDataCollator(train_len)(items)
    for i, (sid, item) in enumerate(zip(ids, items, strict=True)):
        want = ref.get(sid)
        if want is None:
            ok[sid] = False
            continue
        n = len(want[0])
        ok[sid] = (
            (item["input_ids"].tolist(), item["loss_mask"].tolist()) == want
            and (batch["input_ids"][i, :n].tolist(), batch["loss_mask"][i, :n].tolist()) == want
            and not batch["loss_mask"][i, n:].any()
        )
    return ok


def nemo(export_dir: Path, ref: dict[str, Pair]) -> tuple[dict[str, bool], dict[str, int]]:
    """Per sample id: ids and mask unchanged through ``_stack_batch`` (one unpadded row) and
    through ``build_packed_eagle3_dataset`` + ``_pack_collate`` (documents split back at NeMo's
    per-document ``position_ids`` reset)."""
    from nemo_automodel.components.datasets.llm.eagle3 import (
        _pack_collate,
        _stack_batch,
        build_packed_eagle3_dataset,
    )

    path = export_dir / "nemo-automodel.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

    stacked: dict[str, bool] = {}
    for r in rows:
        b = _stack_batch([r])
        got = (b["input_ids"][0].tolist(), b["loss_mask"][0].tolist())
        stacked[r["id"]] = got == ref.get(r["id"]) and bool(b["attention_mask"][0].all())

    width = max(len(r["input_ids"]) for r in rows)
    packs = build_packed_eagle3_dataset(rows, packed_sequence_size=width, pad_token_id=0)
    batch = _pack_collate(packs)
    docs: list[Pair] = []
    for i in range(len(packs)):
        real = int(batch["attention_mask"][i].sum())
        ids = batch["input_ids"][i, :real].tolist()
        mask = batch["loss_mask"][i, :real].tolist()
        pos = batch["position_ids"][i, :real].tolist()
        starts = [j for j, p in enumerate(pos) if p == 0] + [real]
        docs += [(ids[a:b], mask[a:b]) for a, b in itertools.pairwise(starts)]
    # documents come back in row order; a missing or extra document shows up as a mismatch
    packed = {r["id"]: i < len(docs) and docs[i] == ref.get(r["id"]) for i, r in enumerate(rows)}
    if len(docs) != len(rows):
        packed = {k: False for k in packed}

    ok = {sid: stacked[sid] and packed.get(sid, False) for sid in stacked}
    detail = {
        "rows": len(rows),
        "unpadded _stack_batch unchanged": sum(stacked.values()),
        "packed documents": len(docs),
        "packed rows": len(packs),
        "packed width": width,
        "packed unchanged": sum(packed.values()),
    }
    return ok, detail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="?", default=Path("runs/demo"))
    ap.add_argument("--json", type=Path, help="write a JSON summary here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    export_s = export(args.run)
    export_dir = args.run / "export"
    ref = reference(export_dir)

    results: dict[str, dict[str, bool]] = {}
    details: dict[str, dict[str, int]] = {}
    results["modelopt"] = modelopt(export_dir, ref)
    details["modelopt"] = {"files": len(results["modelopt"])}
    results["nemo-automodel"], details["nemo-automodel"] = nemo(export_dir, ref)

    summary: dict[str, object] = {"run": str(args.run), "reference samples": len(ref)}
    failed = False
    for name, ok in results.items():
        same = sum(ok.values())
        # a reference sample the trainer's files lack counts as changed
        bad = [sid for sid in ref if not ok.get(sid, False)]
        bad += [sid for sid in ok if sid not in ref]
        failed |= bool(bad)
        print(f"{name}: {same} of {len(ref)} samples: ids and loss_mask unchanged")
        if bad:
            print(f"  changed or missing: {', '.join(bad[:5])}" + (" ..." if len(bad) > 5 else ""))
        summary[name] = {
            "unchanged": same,
            "samples": len(ref),
            "mismatched": bad,
            **details[name],
        }
    summary["export_s"] = round(export_s, 2)
    summary["total_s"] = round(time.perf_counter() - t0, 2)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
