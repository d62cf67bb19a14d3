"""The samples a hidden-state capture reads: ``Item`` (one sample, its index in the export's
order and its tokens) and ``iter_items``, which streams them from a run's export or from sample
files (``.parquet`` / ``.jsonl``) in name order. Both the pass (``run``) and the layouts read
them from here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ..errors import InputError
from ..files import parquet_batches
from ..lines import strict_jsonl
from ..records import Provenance, Sample

__all__ = ["Item", "input_files", "iter_items"]


@dataclass(frozen=True)
class Item:
    """One sample to capture: its place in the export's order, its id and its tokens."""

    index: int
    id: str
    input_ids: list[int]
    loss_mask: list[bool]
    dataset: str = ""
    token_source: str = ""

    def sample(self) -> Sample:
        """As a sample (its ids and mask; no provenance: the files it came from carry that)."""
        nothing = Provenance("", "", "", "")
        return Sample(
            self.id, self.input_ids, self.loss_mask, 0, "reconstructed", "", nothing, self.dataset
        )


_COLUMNS = ("id", "input_ids", "loss_mask", "dataset", "token_source")


def input_files(src: Path) -> list[Path]:
    """The sample files of a run's export, a folder of sample files, or one file."""
    if (src / "ledger.sqlite").is_file():
        export = src / "export"
        files = sorted(export.glob("shard-*.parquet"))
        if not files:
            raise InputError(f"{src} has no export; run `draftdata export {src}` first")
        return files
    if src.is_dir():
        files = sorted(src.glob("*.parquet")) or sorted(src.glob("*.jsonl"))
    elif src.is_file():
        files = [src]
    else:
        raise InputError(f"{src}: no such run folder or sample file")
    if not files or any(f.suffix not in (".parquet", ".jsonl") for f in files):
        raise InputError(f"{src}: give a run, an export folder, or .parquet / .jsonl sample files")
    return files


def _rows(f: Path) -> Iterator[dict[str, Any]]:
    if f.suffix == ".parquet":
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:
            raise InputError(f"{f}: not a readable Parquet file ({e})") from e
        cols = [c for c in _COLUMNS if c in pf.schema_arrow.names]
        for batch in parquet_batches(pf, batch_size=256, columns=cols):
            yield from batch.to_pylist()
    else:
        yield from strict_jsonl(f, "a sample file (`draftdata reconstruct -o` writes one)")


def iter_items(files: list[Path]) -> Iterator[Item]:
    """Every sample of ``files``, in order, with its global index."""
    index = 0
    for f in files:
        for r in _rows(f):
            try:
                ids = [int(t) for t in r["input_ids"]]
                mask = [bool(b) for b in r["loss_mask"]]
            except (KeyError, TypeError, ValueError) as e:
                raise InputError(
                    f"{f}: row {index} has no usable input_ids / loss_mask ({e}); give files "
                    "that `draftdata export` or `reconstruct -o` wrote"
                ) from e
            if len(ids) != len(mask) or not ids:
                raise InputError(f"{f}: row {index} has {len(ids)} ids and {len(mask)} mask bits")
            yield Item(
                index,
                str(r.get("id") or index),
                ids,
                mask,
                str(r.get("dataset") or ""),
                str(r.get("token_source") or ""),
            )
            index += 1
