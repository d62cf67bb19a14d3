"""Writing samples: JSONL or Parquet (atomic: written to a temporary name, then renamed)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .errors import InputError
from .records import Sample


def sample_row(s: Sample) -> dict[str, Any]:
    return {
        "id": s.id,
        "dataset": s.dataset,
        "input_ids": s.input_ids,
        "loss_mask": s.loss_mask,
        "prompt_len": s.prompt_len,
        "token_source": s.token_source,
        "finish_reason": s.finish_reason,
        "warnings": list(s.warnings),
        "provenance": asdict(s.provenance),
    }


def write_samples(samples: Sequence[Sample], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [sample_row(s) for s in samples]
        table = pa.Table.from_pylist(
            rows,
            schema=pa.schema(
                [
                    ("id", pa.string()),
                    ("dataset", pa.string()),
                    ("input_ids", pa.list_(pa.int32())),
                    ("loss_mask", pa.list_(pa.bool_())),
                    ("prompt_len", pa.int32()),
                    ("token_source", pa.string()),
                    ("finish_reason", pa.string()),
                    ("warnings", pa.list_(pa.string())),
                    (
                        "provenance",
                        pa.struct(
                            [
                                ("tokenizer_sha256", pa.string()),
                                ("format_name", pa.string()),
                                ("format_version", pa.string()),
                                ("draftdata_version", pa.string()),
                            ]
                        ),
                    ),
                ]
            ),
        )
        pq.write_table(table, tmp)
    elif path.suffix in (".jsonl", ".json"):
        with tmp.open("w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(sample_row(s), ensure_ascii=False) + "\n")
    else:
        raise InputError(f"{path}: write .jsonl or .parquet")
    os.replace(tmp, path)
