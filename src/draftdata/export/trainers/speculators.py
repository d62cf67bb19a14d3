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


#: a batch of rows is written once it holds this many tokens (or 1,024 rows): ~50 bytes of
#: Python per token while it is built, so ~13 MB, whatever the answers' lengths
BATCH_TOKENS = 1 << 18
#: a shard file is closed past this many bytes (``save_to_disk``'s default size)
SHARD_BYTES = 500 << 20


def write_dataset(samples: Iterable[Sample], out: Path, keep: tuple[str, ...] = ()) -> Path:
    """``out`` as a ``datasets.save_to_disk`` folder, its Arrow shards written by ``datasets``'
    own ``ArrowWriter`` batch by batch as the samples come (bounded memory: no row is kept,
    and no file is read back: ``save_to_disk`` reads a memory-mapped source whole, whose pages
    counted ~800 MB of the export's peak RSS at 13k Kimi answers). ``state.json`` and
    ``dataset_info.json`` are what ``save_to_disk`` itself writes for these features and this
    format, with the shards' names. Without ``keep`` the folder is swapped in whole; with it,
    the entries of ``out`` named in ``keep`` (the hidden states beside the dataset) stay and the
    rest is replaced entry by entry (``draftdata.files.swap_dir``)."""
    ds_mod = _datasets()
    ds_mod.disable_progress_bars()
    features = ds_mod.Features(
        {
            "id": ds_mod.Value("string"),
            "input_ids": ds_mod.List(ds_mod.Value("int64")),
            "loss_mask": ds_mod.List(ds_mod.Value("int64")),
            "seq_len": ds_mod.Value("int64"),
        }
    )
    staged = stage_dir(out)
    try:
        shards = _write_shards(samples, staged, features)
        _write_state(ds_mod, features, staged, shards)
        swap_dir(staged, out, keep=keep)
    finally:
        discard_dir(staged)  # not swapped in: an error came first
    return out


def _write_shards(samples: Iterable[Sample], folder: Path, features: Any) -> list[str]:
    """The rows in Arrow stream files of at most ``SHARD_BYTES`` each (at least one, so an empty
    export loads), named as ``save_to_disk`` names them; returns the names."""
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter

    schema = features.arrow_schema
    paths: list[Path] = []
    writer: Any = None

    def flush(batch: list[dict[str, Any]]) -> None:
        nonlocal writer
        if writer is None:
            paths.append(folder / f"shard-{len(paths)}.arrow")
            writer = ArrowWriter(features=features, path=str(paths[-1]))
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        if writer.stream.tell() >= SHARD_BYTES:
            writer.finalize()
            writer.close()
            writer = None

    batch: list[dict[str, Any]] = []
    tokens = 0
    for s in samples:
        r = pretokenized_row(s)
        r["seq_len"] = len(s.input_ids)
        batch.append(r)
        tokens += len(s.input_ids)
        if tokens >= BATCH_TOKENS or len(batch) >= 1024:
            flush(batch)
            batch, tokens = [], 0
    if batch or not paths:
        flush(batch)
    if writer is not None:
        writer.finalize()
        writer.close()
    names = [f"data-{i:05d}-of-{len(paths):05d}.arrow" for i in range(len(paths))]
    for p, name in zip(paths, names, strict=True):
        p.rename(folder / name)
    return names


def _write_state(ds_mod: Any, features: Any, folder: Path, shards: list[str]) -> None:
    """``state.json`` and ``dataset_info.json`` as ``save_to_disk`` writes them for an empty
    dataset of ``features`` in the trainer's format (``datasets`` decides every field), with
    ``shards`` as its data files and a fingerprint of their names and sizes."""
    import hashlib

    empty = ds_mod.Dataset.from_dict({k: [] for k in features}, features=features)
    empty.set_format(
        type="torch", columns=["input_ids", "loss_mask", "seq_len"], output_all_columns=True
    )
    template = stage_dir(folder.parent / f"{folder.name}.state")
    try:
        empty.save_to_disk(str(template))
        state = json.loads((template / "state.json").read_text())
        info = (template / "dataset_info.json").read_bytes()
    finally:
        discard_dir(template)
    sizes = ",".join(f"{n}:{(folder / n).stat().st_size}" for n in shards)
    state["_data_files"] = [{"filename": n} for n in shards]
    state["_fingerprint"] = hashlib.sha256(sizes.encode()).hexdigest()[:16]
    (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    (folder / "dataset_info.json").write_bytes(info)
