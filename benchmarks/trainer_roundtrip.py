"""Load a run's trainer exports with the trainers' own code and count the samples whose ids and
mask arrive unchanged (SpecForge 0.2.0 `prepare_prompt_tasks`, speculators 0.9.0
`load_and_preprocess_dataset` and its trainer's `ArrowDataset`).

    draftdata export RUN --as speculators --as specforge
    python benchmarks/trainer_roundtrip.py RUN --tokenizer ../shared/tokenizers/smollm2
"""

from __future__ import annotations

import argparse
import glob
import json
from collections import Counter
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--tokenizer", required=True, help="a transformers tokenizer folder")
    args = ap.parse_args()

    import pyarrow.parquet as pq
    import torch
    from specforge.data.prompt_builder import prepare_prompt_tasks
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset
    from speculators.train.data import ArrowDataset

    export = args.run / "export"
    rows = pq.read_table(sorted(glob.glob(str(export / "shard-*.parquet")))).to_pylist()
    ours = Counter((tuple(r["input_ids"]), tuple(int(b) for b in r["loss_mask"])) for r in rows)

    def same(got: Counter[tuple[tuple[int, ...], tuple[int, ...]]]) -> int:
        return sum((got & ours).values())

    tasks = prepare_prompt_tasks(
        export / "specforge.jsonl",
        None,
        chat_template=None,
        max_length=1 << 20,
        is_preformatted=False,
        train_only_last_turn=False,
        cache_dir=None,
        cache_key=None,
        num_proc=None,
    )
    sf = Counter(
        (tuple(t["payload"]["input_ids"]), tuple(t["payload"]["loss_mask"])) for t in tasks
    )
    ds, _ = load_and_preprocess_dataset(
        args.tokenizer,
        [str(export / "speculators.jsonl")],
        seq_length=1 << 20,
        build_dataset_num_proc=1,
    )
    sp = Counter((tuple(r["input_ids"].tolist()), tuple(r["loss_mask"].tolist())) for r in ds)
    arrow = ArrowDataset(
        max_len=1 << 20,
        datapath=str(export / "speculators-dataset"),
        on_missing="skip",
        hidden_states_dtype=torch.float32,
    )
    ad = Counter(
        (tuple(arrow.data[i]["input_ids"].tolist()), tuple(arrow.data[i]["loss_mask"].tolist()))
        for i in range(len(arrow))
    )
    doc = {
        "samples": len(rows),
        "specforge prepare_prompt_tasks (specforge.jsonl)": same(sf),
        "speculators load_and_preprocess_dataset (speculators.jsonl)": same(sp),
        "speculators ArrowDataset (speculators-dataset/)": same(ad),
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
