"""speculators: our exact ids, ``input_ids`` and ``loss_mask`` (0/1) per sample, as the JSONL that
``speculators prepare-data`` passes through unchanged (``load_and_preprocess_dataset`` with its
pre-tokenized rows) and as the ``save_to_disk`` dataset that its trainer and offline data
generation read (``input_ids`` and ``loss_mask`` int64, ``seq_len``; format torch).

Mask convention: 1 on every token the model produced (the answer, its end marker included when
it ended). speculators shifts it by one for its labels, so it trains every answer token from the
first one (labels P+1..n in its own counting).

The writers take the export's samples in its order (any iterable, read once) and its manifest."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from ...errors import InputError
from ...files import atomic_path, discard_dir, stage_dir, swap_dir
from ...records import Sample
from ...records.export import ExportManifest

#: where the dataset is written under the export
DATASET = "speculators-dataset"
JSONL = "speculators.jsonl"


def pretokenized_row(s: Sample) -> dict[str, Any]:
    return {"id": s.id, "input_ids": s.input_ids, "loss_mask": [int(b) for b in s.loss_mask]}


def write_jsonl(samples: Iterable[Sample], path: Path) -> Path:
    """``path``: one pre-tokenized row per sample (``id``, ``input_ids``, ``loss_mask``)."""
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(pretokenized_row(s)) + "\n")
    return path


def _lines(samples: Iterable[Sample], f: IO[str]) -> Iterator[Sample]:
    for s in samples:
        f.write(json.dumps(pretokenized_row(s)) + "\n")
        yield s


def write_both(
    samples: Iterable[Sample], manifest: ExportManifest, folder: Path
) -> tuple[Path, ...]:
    """``folder/speculators.jsonl`` and ``folder/speculators-dataset/``, in one pass over the
    samples."""
    path = folder / JSONL
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        dataset = write_dataset(_lines(samples, f), folder / DATASET)
    return path, dataset


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as e:
        raise InputError(
            "the speculators dataset is written with Hugging Face `datasets`; install it with "
            "pip install 'draftdata[trainers]'"
        ) from e
    return datasets


def write_dataset(samples: Iterable[Sample], out: Path, keep: tuple[str, ...] = ()) -> Path:
    """``out`` as a ``datasets.save_to_disk`` folder, streamed through an Arrow cache beside it
    (bounded memory). Without ``keep`` the folder is swapped in whole; with it, the entries of
    ``out`` named in ``keep`` (the hidden states beside the dataset) stay and the rest is
    replaced entry by entry (``draftdata.files.swap_dir``)."""
    ds_mod = _datasets()
    ds_mod.disable_progress_bars()
    import pyarrow as pa

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("input_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int64())),
            ("seq_len", pa.int64()),
        ]
    )
    # the Arrow stream `datasets` maps is scratch, in a staging folder of its own: not in the
    # dataset's, since `save_to_disk` refuses to write a dataset into the folder of its source
    scratch, staged = stage_dir(out), stage_dir(out)
    arrow = scratch / "rows.arrow"
    try:
        # an Arrow stream written batch by batch, then memory-mapped by `datasets`: the rows
        # are never all in memory
        with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
            batch: list[dict[str, Any]] = []
            for s in samples:
                r = pretokenized_row(s)
                r["seq_len"] = len(s.input_ids)
                batch.append(r)
                if len(batch) >= 1024:
                    w.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
                    batch = []
            # the last rows (an empty batch keeps an empty export loadable)
            w.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
        ds = ds_mod.Dataset.from_file(str(arrow))
        ds.set_format(
            type="torch", columns=["input_ids", "loss_mask", "seq_len"], output_all_columns=True
        )
        ds.save_to_disk(str(staged))
        del ds
        swap_dir(staged, out, keep=keep)
    finally:
        discard_dir(scratch)
        discard_dir(staged)  # not swapped in: an error came first
    return out
