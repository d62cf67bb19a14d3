"""Parquet shards a trainer loads directly, and the one-file sample writer of `reconstruct -o`.

Every row carries its sample's provenance (tokenizer sha256, format name and version, draftdata
version), read back from the ledger: an export never stamps the current settings on samples made
under others. Shards are split by size and each written whole or not at all (``draftdata.files``);
``write_shards`` writes them from any stream of samples."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..files import atomic_path, stage_dir, swap_dir
from ..lines import strict_jsonl
from ..records import PackedSample, Sample
from ..records.arrow import (
    SAMPLES_SCHEMA,
    SHARD_SCHEMA,
    dictionary_columns,
    sample_row,
    shard_row,
    table_of,
)
from ..records.export import ShardEntry
from ..tokenizers.base import file_sha256

SHARD_BYTES = 256 * 1024 * 1024  # about this much token data per shard
#: a batch of rows becomes a row group once it holds this many tokens (or its row limit): the
#: rows are Python lists until then, ~45 bytes a token with the mask. 2,048 Kimi samples of
#: ~3k tokens each held 340 MB (the 2k rehearsal's export); this holds ~50 MB
BATCH_TOKENS = 1 << 20


class SampleFile:
    """One file of samples (``reconstruct -o``, ``score -o``): ``.jsonl`` or ``.parquet``,
    written as samples arrive (row groups of ``batch_rows``) through ``atomic_path``: renamed into
    place on a clean close, so a crash never leaves half a file under the real name."""

    def __init__(self, path: Path, batch_rows: int = 2048) -> None:
        if path.suffix not in (".parquet", ".jsonl", ".json"):
            raise InputError(f"{path}: write .jsonl or .parquet")
        self.path = path
        self._atomic = ExitStack()
        self.tmp = self._atomic.enter_context(atomic_path(path))
        self.batch_rows = batch_rows
        self.count = 0
        self._tokens = 0
        self._rows: list[dict[str, Any]] = []
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl = None if path.suffix == ".parquet" else self.tmp.open("w", encoding="utf-8")

    def add(self, s: Sample | PackedSample) -> None:
        self.count += 1
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(_listed(sample_row(s)), ensure_ascii=False) + "\n")
            return
        self._rows.append(sample_row(s))
        self._tokens += len(s.input_ids)
        if len(self._rows) >= self.batch_rows or self._tokens >= BATCH_TOKENS:
            self._flush()

    def add_piece(self, piece: pa.Table | str, n: int) -> None:
        """``n`` samples already encoded by ``encode_piece`` (in a worker process, for this
        file's suffix): the writer only writes them, in the order given."""
        self.count += n
        if isinstance(piece, str):
            if self._jsonl is None:
                raise ValueError("a JSON-lines piece for a Parquet file")
            self._jsonl.write(piece)
            return
        self._flush()  # rows added one by one first, so the order holds
        assert self._parquet is not None
        if piece.num_rows:
            self._parquet.write_table(piece)

    def _flush(self) -> None:
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(
                self.tmp,
                SAMPLES_SCHEMA,
                use_dictionary=dictionary_columns(SAMPLES_SCHEMA),
                write_statistics=dictionary_columns(SAMPLES_SCHEMA),
            )
        if self._rows:
            self._parquet.write_table(table_of(self._rows, SAMPLES_SCHEMA))
            self._rows, self._tokens = [], 0

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        else:
            self._flush()
            assert self._parquet is not None
            self._parquet.close()
        self._atomic.close()  # renamed into place

    def abort(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        elif self._parquet is not None:
            self._parquet.close()
        _discard(self._atomic)

    def __enter__(self) -> SampleFile:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _discard(stack: ExitStack) -> None:
    """Leave the ``atomic_path`` blocks held open in ``stack`` as failed: their temporary files
    are removed and nothing is renamed."""
    gone = InputError("write abandoned")
    stack.__exit__(type(gone), gone, None)


def takes_arrays(path: Path) -> bool:
    """Whether the sample file ``path`` is best written from PackedSamples (Parquet: its
    columns are built from the arrays; JSON lines want lists)."""
    return path.suffix == ".parquet"


def encode_piece(
    samples: Iterable[Sample | PackedSample], path: Path
) -> tuple[pa.Table | str, int]:
    """Samples as one piece of the sample file ``path`` (an Arrow table for Parquet, JSON lines
    otherwise) and their number: what ``SampleFile.add_piece`` writes."""
    rows = [sample_row(s) for s in samples]
    if path.suffix == ".parquet":
        return table_of(rows, SAMPLES_SCHEMA), len(rows)
    return "".join(json.dumps(_listed(r), ensure_ascii=False) + "\n" for r in rows), len(rows)


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    """A row for JSON: a PackedSample's arrays as lists."""
    if isinstance(row["input_ids"], np.ndarray):
        return row | {k: row[k].tolist() for k in ("input_ids", "loss_mask")}
    return row


def write_samples(samples: Iterable[Sample | PackedSample], path: Path) -> int:
    """One file of samples (``reconstruct -o``): .jsonl or .parquet, written atomically; the
    number written."""
    with SampleFile(path) as f:
        for s in samples:
            f.add(s)
    return f.count


def read_samples(path: Path) -> tuple[list[Path], list[Sample]]:
    """Samples back from a file written here (``.parquet`` or ``.jsonl``) or a folder of them
    (an export's shards); the files read, and the samples in file order."""
    from ..records import Key, Provenance

    if path.is_dir():
        files = sorted(path.glob("*.parquet")) or sorted(path.glob("*.jsonl"))
    else:
        files = [path]
    if not files:
        raise InputError(f"{path}: no .parquet or .jsonl sample files here")
    out: list[Sample] = []
    for f in files:
        if f.suffix == ".parquet":
            try:
                rows = pq.read_table(f).to_pylist()
            except (pa.ArrowInvalid, OSError) as e:
                raise InputError(f"{f}: not a readable Parquet file ({e})") from e
        elif f.suffix in (".jsonl", ".json"):
            rows = list(strict_jsonl(f, "a sample file (`draftdata reconstruct -o` writes one)"))
        else:
            raise InputError(f"{f}: read .parquet or .jsonl sample files")
        for i, r in enumerate(rows):
            try:
                prov = r.get("provenance") or {}
                key = None
                if r.get("prompt_id") is not None:
                    key = Key(r["dataset"], r["prompt_id"], int(r["sample_idx"]), int(r["turn"]))
                out.append(
                    Sample(
                        id=str(r.get("id") or i),
                        dataset=str(r.get("dataset") or ""),
                        input_ids=[int(t) for t in r["input_ids"]],
                        loss_mask=[bool(b) for b in r["loss_mask"]],
                        prompt_len=int(r["prompt_len"]),
                        token_source=r.get("token_source") or "reconstructed",
                        finish_reason=str(r.get("finish_reason") or "stop"),
                        provenance=Provenance(
                            prov.get("tokenizer_sha256", ""),
                            prov.get("format_name", ""),
                            prov.get("format_version", ""),
                            prov.get("draftdata_version", ""),
                        ),
                        warnings=tuple(r.get("warnings") or ()),
                        key=key,
                    )
                )
            except (AttributeError, KeyError, TypeError, ValueError) as e:
                raise InputError(
                    f"{f}: row {i} is not a sample ({e}); score reads what `draftdata "
                    "reconstruct -o` and `draftdata export` write"
                ) from e
    return files, out


class ShardWriter:
    """Rows in, ``shard-NNNNN.parquet`` files out, each closed at about ``max_bytes`` of ids."""

    def __init__(self, folder: Path, max_bytes: int = SHARD_BYTES, batch_rows: int = 2048) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.batch_rows = batch_rows
        self.shards: list[ShardEntry] = []
        self._writer: pq.ParquetWriter | None = None
        self._atomic = ExitStack()
        self._rows: list[dict[str, Any]] = []
        self._tokens = 0
        self._shard_rows = 0
        self._shard_bytes = 0

    def add(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        n = len(row["input_ids"])
        self._tokens += n
        self._shard_bytes += 5 * n
        if len(self._rows) >= self.batch_rows or self._tokens >= BATCH_TOKENS:
            self._flush()
        if self._shard_bytes >= self.max_bytes:
            self._close_shard()

    def _flush(self) -> None:
        if not self._rows:
            return
        if self._writer is None:
            tmp = self._atomic.enter_context(atomic_path(self._path()))
            self._writer = pq.ParquetWriter(
                tmp,
                SHARD_SCHEMA,
                compression="zstd",
                use_dictionary=dictionary_columns(SHARD_SCHEMA),
                write_statistics=dictionary_columns(SHARD_SCHEMA),
            )
        self._writer.write_table(table_of(self._rows, SHARD_SCHEMA))
        self._shard_rows += len(self._rows)
        self._rows, self._tokens = [], 0

    def _path(self) -> Path:
        return self.folder / f"shard-{len(self.shards):05d}.parquet"

    def _close_shard(self) -> None:
        self._flush()
        if self._writer is None:
            return
        self._writer.close()
        final = self._path()
        self._atomic.close()  # renamed into place
        self.shards.append(
            ShardEntry(final.name, self._shard_rows, final.stat().st_size, file_sha256(final))
        )
        self._writer, self._shard_rows, self._shard_bytes = None, 0, 0

    def close(self) -> list[ShardEntry]:
        self._close_shard()
        return self.shards

    def abort(self) -> None:
        """Drop the shard being written (its temporary file); the closed ones stay."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        _discard(self._atomic)


def write_shards(
    samples: Iterable[Sample],
    folder: Path,
    *,
    metadata: Callable[[Sample], Mapping[str, Any]] | None = None,
    max_bytes: int = SHARD_BYTES,
) -> list[ShardEntry]:
    """A run's samples (each with a key) as ``folder/shard-NNNNN.parquet``, in the order given;
    ``metadata`` gives each sample's prompt metadata (none: ``{}``). The shards written."""
    writer = ShardWriter(folder, max_bytes=max_bytes)
    try:
        for s in samples:
            writer.add(shard_row(s, metadata(s) if metadata is not None else {}))
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def staging_folder(run_dir: Path) -> Path:
    """A new, empty folder for the next export, beside the current one
    (``draftdata.files.stage_dir``: the leftovers of killed exports are removed first)."""
    return stage_dir(run_dir / "export")


def publish(run_dir: Path, staged: Path) -> Path:
    """Make ``staged`` the run's export in one step: ``RUN/export`` is a symlink, swapped with
    an atomic rename, so a reader (or a kill -9) sees the old export or the new one, whole.
    Older exports are removed after the swap (``draftdata.files.swap_dir(link=True)``)."""
    return swap_dir(staged, run_dir / "export", link=True)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
