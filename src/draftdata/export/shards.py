"""Parquet shards a trainer loads directly, and the one-file sample writer of `reconstruct -o`.

Every row carries its sample's provenance (tokenizer sha256, format name and version, draftdata
version), read back from the ledger: an export never stamps the current settings on samples made
under others. Shards are split by size and each written whole or not at all (``draftdata.files``);
``write_shards`` writes them from any stream of samples."""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from datetime import datetime, timezone
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..files import atomic_path, stage_dir, swap_dir
from ..lines import strict_jsonl
from ..records import PackedSample, Sample
from ..records.export import ShardEntry
from ..tokenizers.base import file_sha256

SHARD_BYTES = 256 * 1024 * 1024  # about this much token data per shard
#: a batch of rows becomes a row group once it holds this many tokens (or its row limit): the
#: rows are Python lists until then, ~45 bytes a token with the mask. 2,048 Kimi samples of
#: ~3k tokens each held 340 MB (the 2k rehearsal's export); this holds ~50 MB
BATCH_TOKENS = 1 << 20

_PROVENANCE = pa.struct(
    [
        ("tokenizer_sha256", pa.string()),
        ("format_name", pa.string()),
        ("format_version", pa.string()),
        ("draftdata_version", pa.string()),
    ]
)
_PROVENANCE_FIELDS = tuple(_PROVENANCE.field(i).name for i in range(_PROVENANCE.num_fields))
# the columns every sample file has, in both shapes below
_TOKENS = [
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.bool_())),
    ("prompt_len", pa.int32()),
    ("token_source", pa.string()),
    ("finish_reason", pa.string()),
    ("warnings", pa.list_(pa.string())),
    ("provenance", _PROVENANCE),
]
_ID = [("id", pa.string()), ("dataset", pa.string())]

#: a run's shards
SHARD_SCHEMA = pa.schema(
    [
        *_ID,
        ("prompt_id", pa.string()),
        ("sample_idx", pa.int32()),
        ("turn", pa.int32()),
        *_TOKENS,
        ("metadata", pa.string()),
    ]
)
#: `reconstruct -o X.parquet`: a standalone file of samples
SAMPLES_SCHEMA = pa.schema([*_ID, *_TOKENS])


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Every column but the ids and the mask: a dictionary of token ids is as large as the
    vocabulary and pyarrow gives up on it after building it (measured on 9,810 Kimi samples:
    0.56 -> 0.44 s to write, 29.0 -> 23.7 MB). The same columns get statistics: a row group's
    min and max token id says nothing a reader filters on (0.415 -> 0.378 s to write)."""
    return [n for n in schema.names if n not in ("input_ids", "loss_mask")]


def sample_row(s: Sample | PackedSample) -> dict[str, Any]:
    return {
        "id": s.id,
        "dataset": s.dataset,
        "input_ids": s.input_ids,
        "loss_mask": s.loss_mask,
        "prompt_len": s.prompt_len,
        "token_source": s.token_source,
        "finish_reason": s.finish_reason,
        "warnings": list(s.warnings),
        "provenance": _provenance(s.provenance),
    }


def _provenance(p: Any) -> dict[str, str]:
    # asdict deep-copies through every field: 80 us a sample, most of a worker's row building
    return {f: getattr(p, f) for f in _PROVENANCE_FIELDS}


def shard_row(s: Sample, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A run sample as a shard row (the key's parts, and the prompt's metadata as JSON)."""
    if s.key is None:
        raise ValueError(f"sample {s.id} has no key; only a run's samples go into shards")
    return {
        **sample_row(s),
        "prompt_id": s.key.prompt_id,
        "sample_idx": s.key.sample_idx,
        "turn": s.key.turn,
        "metadata": json.dumps(metadata, ensure_ascii=False, default=str),
    }


def _flat_lists(values: list[Any], t: pa.ListType) -> pa.Array:
    """Lists of ints (int32) or bools as one Arrow list array, its values and offsets filled
    from C arrays: the ints through one ``np.fromiter`` over the chained lists (twice as fast
    as extending an array list by list), a mask that is one run of False then one of True
    (every sample but an all-turns one) written as the two runs. Arrays (a PackedSample's) are
    joined as they are."""
    lengths = np.fromiter(map(len, values), dtype="<i4", count=len(values))
    offsets = np.zeros(len(values) + 1, dtype="<i4")
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1])
    if values and all(isinstance(v, np.ndarray) for v in values):
        items = _joined(values, t.value_type, n)
    elif pa.types.is_boolean(t.value_type):
        flat = bytearray()
        for v in values:
            if isinstance(v, np.ndarray):  # a PackedSample's, among lists
                flat += v.astype(np.uint8).tobytes()
                continue
            trained = v.count(True)
            if trained == 0 or v.index(True) == len(v) - trained:  # False... then True...
                flat += bytes(len(v) - trained)
                flat += b"\x01" * trained
            else:
                flat.extend(v)
        bits = np.packbits(np.frombuffer(flat, dtype=np.uint8) != 0, bitorder="little")
        items = pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bits)])
    else:
        ids = np.fromiter(chain.from_iterable(values), dtype="<i4", count=n)
        items = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(ids)])
        if t.value_type != pa.int32():
            items = items.cast(t.value_type)
    return pa.ListArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), len(values) + 1, [None, pa.py_buffer(offsets)]),
        items,
        type=t,
    )


def _joined(values: list[Any], t: pa.DataType, n: int) -> pa.Array:
    """Arrays of ints or bools as the flat values of a list column of ``t``."""
    flat = np.concatenate(values)
    if pa.types.is_boolean(t):
        bits = np.packbits(flat.astype(bool), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bits)])
    ids = np.ascontiguousarray(flat, dtype="<i4")  # no copy where it is that already
    items = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(ids)])
    return items if t == pa.int32() else items.cast(t)


def _validity(values: list[Any]) -> pa.Buffer | None:
    present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    return None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))


def _strings(values: list[Any]) -> pa.Array:
    data = bytearray()
    offsets = array("i", [0])
    for v in values:
        if v is not None:
            data += v.encode("utf-8")
        offsets.append(len(data))
    if sys.byteorder == "big":
        offsets.byteswap()
    bufs = [_validity(values), pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(values), bufs)


def _column(values: list[Any], t: pa.DataType) -> pa.Array:
    """One column built from its buffers. ``pa.array`` of a Python list asks pandas whether
    the list is array-like, and that imports pandas: half a second of every command that
    writes Parquet, for nothing."""
    if pa.types.is_list(t) and (
        pa.types.is_integer(t.value_type) or pa.types.is_boolean(t.value_type)
    ):
        return _flat_lists(values, t)
    if pa.types.is_string(t):
        return _strings(values)
    if t in (pa.int32(), pa.int64()) and None not in values:
        return pa.Array.from_buffers(
            t, len(values), [None, pa.py_buffer(np.array(values, dtype=t.to_pandas_dtype()))]
        )
    if pa.types.is_list(t) and pa.types.is_string(t.value_type) and None not in values:
        offsets = array("i", [0])
        for v in values:
            offsets.append(offsets[-1] + len(v))
        items = _strings([x for v in values for x in v])
        if sys.byteorder == "big":
            offsets.byteswap()
        starts = pa.Array.from_buffers(pa.int32(), len(values) + 1, [None, pa.py_buffer(offsets)])
        return pa.ListArray.from_arrays(starts, items, type=t)
    if pa.types.is_struct(t) and None not in values:
        fields = [t.field(i) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(
            [_column([v[f.name] for v in values], f.type) for f in fields], fields=fields
        )
    cells = np.empty(len(values), dtype=object)  # pyarrow's own conversion, for the rest
    for i, v in enumerate(values):
        cells[i] = v
    return pa.array(cells, t)


def table_of(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows as an Arrow table, each column built from flat buffers (the generic
    ``from_pylist`` walks every id as a Python object: several times slower)."""
    return pa.Table.from_arrays(
        [_column([r[f.name] for r in rows], f.type) for f in schema], schema=schema
    )


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
                use_dictionary=_dictionary_columns(SAMPLES_SCHEMA),
                write_statistics=_dictionary_columns(SAMPLES_SCHEMA),
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
                use_dictionary=_dictionary_columns(SHARD_SCHEMA),
                write_statistics=_dictionary_columns(SHARD_SCHEMA),
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
