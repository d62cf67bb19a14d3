"""Samples as Arrow rows and tables: the columns of a run's shards and of a file of samples,
built from flat buffers. The export writes them (``export.shards``); a run read from Python
returns them (``session.Run.to_arrow``)."""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Mapping
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from . import PackedSample, Sample

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


def dictionary_columns(schema: pa.Schema) -> list[str]:
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
