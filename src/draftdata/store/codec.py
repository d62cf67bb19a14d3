"""The ledger's serialiser: records to the columns that hold them, and back. One function pair
per record; nothing else in draftdata writes or reads these columns.

Ids are int32 arrays and masks one byte per token, both compressed BLOBs (a mask is two runs: it
compresses to a few bytes); raw request and response bodies are compressed UTF-8, the exact text
as it arrived. JSON stays for the small structured columns.

Compressed is a zstd frame (schema 5). A schema-4 ledger's rows are zlib streams; they are read
as they are (the two are told apart by the frame's magic number, which no zlib header has), so a
migrated ledger holds both. zstd at level 1: the same size as zlib's level 1 on these bodies and
ids, at a fifth of its CPU (26 -> 5.6 us for a 0.8 KB body: most of zlib's is setting up its
state, per call), and decompressed twice as fast."""

from __future__ import annotations

import json
import sys
import threading
import zlib
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import zstandard

from ..records import (
    Flag,
    Key,
    Message,
    Prompt,
    Provenance,
    Repair,
    Sample,
    SampleScore,
    StoredScore,
    ToolCall,
)


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str)


def messages_to_json(msgs: Iterable[Message]) -> str:
    return dumps(
        [
            {
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "tool_calls": [
                    {"id": c.id, "type": c.type, "name": c.name, "arguments": c.arguments}
                    for c in m.tool_calls
                ],
                "tool_call_id": m.tool_call_id,
                "name": m.name,
            }
            for m in msgs
        ]
    )


def messages_from_json(text: str) -> tuple[Message, ...]:
    return tuple(
        Message(
            d["role"],
            d["content"],
            d.get("reasoning"),
            tuple(
                ToolCall(c["name"], c["arguments"], c.get("id"), c.get("type", "function"))
                for c in d["tool_calls"]
            ),
            d.get("tool_call_id"),
            d.get("name"),
        )
        for d in json.loads(text)
    )


def prompt_row(p: Prompt) -> tuple[str, str, str]:
    """(messages, tools, metadata) columns."""
    return messages_to_json(p.messages), dumps(list(p.tools)), dumps(p.metadata)


def prompt_of(prompt_id: str, dataset: str, messages: str, tools: str, metadata: str) -> Prompt:
    return Prompt(
        prompt_id,
        dataset,
        messages_from_json(messages),
        tuple(json.loads(tools)),
        json.loads(metadata),
    )


#: zstd level: 1 is within a few percent of 3 on ids and JSON bodies, at the least CPU
LEVEL = 1
_BIG = sys.byteorder == "big"
#: every zstd frame starts with it; a zlib stream cannot (its header fails zlib's check)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: what reading a damaged BLOB raises
BlobError = (zlib.error, zstandard.ZstdError)
#: zstd contexts are not safe to share between threads: one pair per thread
_local = threading.local()


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    try:
        got: tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor] = _local.pair
    except AttributeError:
        got = _local.pair = (zstandard.ZstdCompressor(level=LEVEL), zstandard.ZstdDecompressor())
    return got


def compress(raw: bytes) -> bytes:
    return _zstd()[0].compress(raw)


def decompress(blob: bytes) -> bytes:
    """A BLOB this codec wrote: a zstd frame, or a zlib stream (schema 4)."""
    if blob[:4] == ZSTD_MAGIC:
        return _zstd()[1].decompress(blob)
    return zlib.decompress(blob)


def _int32(ids: Iterable[int]) -> bytes:
    a = array("i", ids)
    if _BIG:  # stored little-endian on every machine
        a.byteswap()
    return a.tobytes()


def pack_ids(ids: Iterable[int] | None) -> bytes | None:
    return None if ids is None else compress(_int32(ids))


def unpack_ids(blob: bytes | str | None) -> tuple[int, ...] | None:
    ids = _ids_list(blob)
    return None if ids is None else tuple(ids)


def ids_array(blob: bytes | str | None) -> array[int] | None:
    """``unpack_ids`` as an ``array('i')``: 4 bytes an id where a list of ints takes 36."""
    if blob is None:
        return None
    if isinstance(blob, str):  # a schema-3 JSON column, read in place
        return array("i", json.loads(blob))
    a = array("i")
    a.frombytes(decompress(blob))
    if _BIG:
        a.byteswap()
    return a


def ids_list(blob: bytes | str | None) -> list[int] | None:
    """``unpack_ids`` as a list."""
    return _ids_list(blob)


def _ids_list(blob: bytes | str | None) -> list[int] | None:
    a = ids_array(blob)
    return None if a is None else a.tolist()


def pack_mask(mask: Sequence[bool]) -> bytes:
    return compress(bytes(bytearray(mask)))


def unpack_mask(blob: bytes | str) -> list[bool]:
    if isinstance(blob, str):  # a schema-3 JSON column, read in place
        return [bool(b) for b in json.loads(blob)]
    return list(map(_ONE, decompress(blob)))  # one byte a token: 1 trained, 0 not


_ONE = (1).__eq__


def pack_text(text: str | None) -> bytes | None:
    """A raw body, compressed; ``unpack_text`` gives back the exact text. A body that was not
    UTF-8 arrives as text with surrogate escapes (``errors="surrogateescape"``): it is stored as
    the bytes that came. Lone surrogates of any other kind (a ``\\ud800`` escape in a prompt)
    are kept with ``surrogatepass``."""
    if text is None:
        return None
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")
    return compress(raw)


def unpack_text(blob: bytes | str | None) -> str | None:
    if blob is None or isinstance(blob, str):  # a text column of an unmigrated row
        return blob
    raw = decompress(blob)
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # bytes as a server sent them, not UTF-8
        return raw.decode("utf-8", "surrogateescape")


def sample_row(s: Sample) -> tuple[Any, ...]:
    """The samples table's columns after the key, in table order."""
    p = s.provenance
    return (
        s.token_source,
        s.finish_reason,
        pack_ids(s.input_ids),
        pack_mask(s.loss_mask),
        s.prompt_len,
        dumps(list(s.warnings)),
        p.tokenizer_sha256,
        p.format_name,
        p.format_version,
        p.draftdata_version,
    )


def row_warnings(row: Sequence[Any]) -> tuple[str, ...]:
    """The warnings of a sample packed by ``sample_row``."""
    return tuple(json.loads(row[5]))


def with_row_warnings(row: Sequence[Any], warnings: Sequence[str]) -> tuple[Any, ...]:
    """A row packed by ``sample_row`` with its warnings replaced by ``warnings``."""
    return (*row[:5], dumps(list(warnings)), *row[6:])


SAMPLE_COLUMNS = (
    "token_source, finish_reason, input_ids, loss_mask, prompt_len, warnings_json, "
    "tokenizer_sha256, format_name, format_version, draftdata_version"
)


def sample_of(key: Key, row: Sequence[Any]) -> Sample:
    """A sample back from the columns written by ``sample_row``."""
    return Sample(
        id=key.sample_id,
        key=key,
        dataset=key.dataset,
        token_source=row[0],
        finish_reason=row[1],
        input_ids=_ids_list(row[2]) or [],
        loss_mask=unpack_mask(row[3]),
        prompt_len=row[4],
        warnings=tuple(json.loads(row[5])),
        provenance=Provenance(row[6], row[7], row[8], row[9]),
    )


def score_row(
    model: str, threshold: float, s: SampleScore, repairs: Sequence[Repair]
) -> tuple[Any, ...]:
    """A sample's score as the ``scores`` columns from ``model`` to ``repairs_json``."""
    flags = [[f.position, f.token, f.logprob, f.kind] for f in s.flags]
    fixes = [[r.position, r.old, r.new, r.old_logprob, r.new_logprob] for r in repairs]
    return (
        model,
        threshold,
        s.token_source,
        s.trained,
        s.sum_logprob,
        s.min_logprob,
        dumps(flags),
        dumps(fixes),
    )


def score_of(key: Key, row: Sequence[Any]) -> StoredScore:
    """A score back from the columns ``model`` .. ``repairs_json``."""
    flags = tuple(Flag(p, t, lp, k) for p, t, lp, k in json.loads(row[6]))
    fixes = tuple(Repair(p, o, n, a, b) for p, o, n, a, b in json.loads(row[7]))
    score = SampleScore(
        key.sample_id, key.dataset, row[2], row[3], row[4], row[5], flags, len(fixes)
    )
    return StoredScore(key, row[0], row[1], score, fixes)
