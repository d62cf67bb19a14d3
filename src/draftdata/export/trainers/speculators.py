"""speculators: JSONL of our exact ids, ``input_ids`` and ``loss_mask`` as 0/1 per sample."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...generate.runner import Runner


def write_jsonl(runner: Runner, folder: Path) -> Path:
    path = folder / "speculators.jsonl"
    tmp = folder / ".speculators.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        for d in runner.m.datasets:
            for s in runner.ledger.samples(d.name):
                row = {
                    "id": s.id,
                    "input_ids": s.input_ids,
                    "loss_mask": [int(b) for b in s.loss_mask],
                }
                f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
    return path
