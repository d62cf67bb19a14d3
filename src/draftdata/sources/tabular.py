"""The ``parquet`` reader: a Parquet file, a folder of Parquet files (a HF dataset repository),
or a HF ``datasets`` ``save_to_disk`` folder (Arrow stream files), read with pyarrow only and
streamed batch by batch (one row group at a time), reading only the mapped columns.

Columns come from the dataset's ``columns`` manifest key: ``messages`` (a list of ``{role,
content}`` structs) or ``prompt`` (plain text, one user message), plus optional ``system``,
``tools`` and ``id``. Without a mapping a ``messages`` column is used, else ``prompt``; ``system``,
``tools`` and ``id`` columns are used where they exist."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..files import parquet_batches
from ..records import Message, Prompt
from ..records.wire import messages_of
from .base import make_prompt, reader
from .common import Skip, _text, _with_user, tools_of

KEYS = ("messages", "prompt", "system", "tools", "id")
BATCH_ROWS = 1024


def _fix(key: str) -> str:
    return f'set `columns = {{ {key} = "<column>" }}` in the dataset\'s manifest entry'


def data_files(path: Path) -> list[Path]:
    """The files holding a dataset's rows, in order."""
    if not path.exists():
        raise InputError(f"{path}: no such file or folder; check the dataset's `source`")
    if path.is_file():
        return [path]
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise InputError(
            f"{path} is a saved DatasetDict; point `source` at one split folder "
            f"({', '.join(str(path / s) for s in splits) or 'none found'})"
        )
    state = path / "state.json"
    if state.is_file():
        try:
            names = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"{state}: unreadable save_to_disk state ({e})") from e
        inside = path.resolve()
        for n in names:  # save_to_disk names its files beside the state, nothing else
            if not isinstance(n, str) or not (inside / n).resolve().is_relative_to(inside):
                raise InputError(
                    f"{state}: names a data file outside its folder ({n!r}); a save_to_disk "
                    "state names only the files beside it: fix or remove state.json"
                )
        return [path / n for n in names]
    files = sorted(path.glob("*.arrow")) or sorted(path.rglob("*.parquet"))
    if not files:
        raise InputError(
            f"{path}: no .parquet or .arrow files; point `source` at a Parquet file, a folder "
            "of Parquet files, or a `save_to_disk` folder"
        )
    return files


class _Table:
    """One data file opened for streaming: its column names and its batches."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self._src: Any = None
        try:
            if file.suffix == ".arrow":
                self._src = pa.memory_map(str(file))
                try:
                    self._ipc: Any = pa.ipc.open_stream(self._src)
                except pa.ArrowInvalid:  # the random-access file format
                    self._src.seek(0)
                    self._ipc = pa.ipc.open_file(self._src)
                self.names: list[str] = list(self._ipc.schema.names)
            else:
                self._pq: Any = pq.ParquetFile(file)
                self.names = list(self._pq.schema_arrow.names)
        except (OSError, pa.ArrowException) as e:
            self.close()
            raise InputError(f"{file}: cannot read as Parquet/Arrow ({e})") from e

    def batches(self, cols: list[str]) -> Iterator[list[dict[str, Any]]]:
        try:
            if self._src is None:
                for b in parquet_batches(self._pq, batch_size=BATCH_ROWS, columns=cols):
                    yield b.to_pylist()
            elif isinstance(self._ipc, pa.ipc.RecordBatchFileReader):
                for i in range(self._ipc.num_record_batches):
                    yield self._ipc.get_batch(i).select(cols).to_pylist()
            else:
                for b in self._ipc:
                    yield b.select(cols).to_pylist()
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"{self.file}: read failed ({e})") from e

    def close(self) -> None:
        if self._src is not None:
            self._src.close()


def resolve_columns(names: list[str], columns: Mapping[str, str], file: Path) -> dict[str, str]:
    """Manifest ``columns`` against a file's columns; an unknown key or column names the fix."""
    avail = ", ".join(names)
    out: dict[str, str] = {}
    for key, col in columns.items():
        if key not in KEYS:
            raise InputError(
                f"columns.{key}: unknown key for the parquet reader; use {', '.join(KEYS)}"
            )
        if col not in names:
            raise InputError(
                f"{file}: column {col!r} (columns.{key}) not found; available columns: {avail}; "
                + _fix(key)
            )
        out[key] = col
    if "messages" in out and "prompt" in out:
        raise InputError("columns: set either `messages` or `prompt`, not both")
    if "messages" not in out and "prompt" not in out:
        if "messages" in names:
            out["messages"] = "messages"
        elif "prompt" in names:
            out["prompt"] = "prompt"
        else:
            raise InputError(
                f"{file}: no `messages` or `prompt` column; available columns: {avail}; "
                + _fix("messages")
                + " (a list of {role, content}) or `prompt` (plain text)"
            )
    for key in ("system", "tools", "id"):
        if key not in out and key in names:
            out[key] = key
    return out


def _drop_nulls(x: Any) -> Any:
    """Arrow structs give every row every field, absent ones as null: drop those again."""
    if isinstance(x, dict):
        return {k: _drop_nulls(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_nulls(v) for v in x]
    return x


def row_prompt(row: Mapping[str, Any], cols: Mapping[str, str], dataset: str) -> Prompt:
    if "messages" in cols:
        raw = row[cols["messages"]]
        if not isinstance(raw, list) or not raw:
            raise Skip("no_messages")
        try:
            msgs = list(messages_of(raw))
        except InputError:
            raise Skip("bad_message") from None
        for m in msgs:
            if m.role != "assistant" or not m.tool_calls:
                _text(m.content)
    else:
        msgs = [Message("user", _text(row[cols["prompt"]]))]
    system = row.get(cols["system"]) if "system" in cols else None
    has_it = bool(msgs) and msgs[0].role == "system" and msgs[0].content == system
    if isinstance(system, str) and system.strip() and not has_it:
        msgs.insert(0, Message("system", system))
    raw_tools = row.get(cols["tools"]) if "tools" in cols else None
    tools = tools_of(_drop_nulls(raw_tools))
    meta = {"id": row[cols["id"]]} if "id" in cols and row[cols["id"]] is not None else {}
    return make_prompt(dataset, _with_user(msgs), tools, **meta)


@reader("parquet")
def read_parquet(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """Rows of Parquet / Arrow files (see the module docstring for the column mapping)."""
    for file in data_files(path):
        table = _Table(file)
        try:
            cols = resolve_columns(table.names, columns, file)
            for rows in table.batches(sorted(set(cols.values()))):
                for row in rows:
                    try:
                        yield row_prompt(row, cols, dataset)
                    except Skip as s:
                        counter[s.reason] += 1
        finally:
            table.close()
