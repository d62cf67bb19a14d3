"""The readers' table (``READERS``, ``reader``), the helpers every reader shares, the built-in
mtbench / openai readers and the entry points (``read_prompts``, ``iter_prompts``,
``read_ground_truth``). The reader modules (native, tabular) import from here, and the package's
``__init__`` imports them to register their readers, so no module imports one that imports it.

Malformed records are skipped and counted by reason, never fatal."""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..config import READER_NAMES
from ..errors import InputError
from ..files import not_a_file
from ..lines import MAX_LINE_BYTES, capped_lines
from ..nesting import TooDeep, loads_json
from ..records import GroundTruth, Message, Prompt
from ..records.wire import ground_truth_of, messages_of

Reader = Callable[[Path, str, Mapping[str, str], Counter[str]], Iterator[Prompt]]
READERS: dict[str, Reader] = {}


def reader(name: str) -> Callable[[Reader], Reader]:
    """Register a reader under ``name``, one of ``config.READER_NAMES`` (the names the manifest
    accepts, checked when it is loaded)."""
    if name not in READER_NAMES:
        raise LookupError(f"reader {name!r}: add it to config.READER_NAMES, the manifest's names")

    def deco(fn: Reader) -> Reader:
        READERS[name] = fn
        return fn

    return deco


def prompt_id(messages: tuple[Message, ...], tools: tuple[dict[str, Any], ...] = ()) -> str:
    doc = json.dumps(
        [[m.role, m.content, [(c.name, c.arguments) for c in m.tool_calls]] for m in messages]
        + [list(tools)],
        ensure_ascii=False,
        sort_keys=True,
    )
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def make_prompt(
    dataset: str,
    messages: tuple[Message, ...],
    tools: tuple[dict[str, Any], ...] = (),
    **metadata: Any,
) -> Prompt:
    return Prompt(prompt_id(messages, tools), dataset, messages, tools, metadata)


def open_bytes(path: Path) -> Any:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return path.open("rb")


def open_text(path: Path) -> Any:
    """A text file (gzip or not) decoded as UTF-8 with a leading BOM dropped."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return path.open(encoding="utf-8-sig")


def _clean(rec: Any, counter: Counter[str]) -> dict[str, Any] | None:
    """A record that is an object and holds only encodable text, or None (counted)."""
    if not isinstance(rec, dict):
        counter["not_an_object"] += 1
        return None
    try:  # a lone surrogate (a "\ud800" escape, or a bad byte let through) cannot be encoded
        json.dumps(rec, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        counter["invalid_text_lone_surrogate"] += 1
        return None
    return rec


def iter_json_records(path: Path, counter: Counter[str]) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file, or of a JSON array file, read record by record: a bad line, a
    bad byte or a lone surrogate skips that record only (counted). A UTF-8 BOM is accepted."""
    kind = not_a_file(path, pipes=True)
    if kind is not None:
        raise InputError(f"{path}: not a regular file ({kind}); give a JSONL or JSON file")
    try:
        f = open_bytes(path)
    except OSError as e:
        raise InputError(f"{path}: cannot open ({e.strerror}); check the dataset source") from e
    with f:
        try:
            yield from _records_of(f, path, counter)
        except (OSError, EOFError, zlib.error) as e:  # a damaged gzip stream, a failing disk
            fix = (
                "the gzip file is damaged or not gzip: compress it again or pass the plain file"
                if path.suffix == ".gz"
                else "check the file and the disk"
            )
            raise InputError(f"{path}: cannot read ({e}); {fix}") from e


def _records_of(f: Any, path: Path, counter: Counter[str]) -> Iterator[dict[str, Any]]:
    """The records of the open file ``f`` (see ``iter_json_records``)."""
    head = f.read(4)
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    rest = head.lstrip()
    blank = head.count(b"\n") - rest.count(b"\n")  # lines before the first that holds text
    while not rest:
        chunk = f.read(4096)
        if not chunk:
            return
        rest = chunk.lstrip()
        blank += chunk.count(b"\n") - rest.count(b"\n")
    if rest[:1] == b"[":
        whole = rest + f.read(MAX_LINE_BYTES + 1 - len(rest))
        if len(whole) > MAX_LINE_BYTES:
            raise InputError(
                f"{path}: a JSON array file over {MAX_LINE_BYTES >> 20} MiB; write it as JSONL "
                "(one record per line), which is read a line at a time"
            )
        text = whole.decode("utf-8", errors="surrogateescape")
        del whole
        try:
            data = loads_json(text)
        except ValueError as e:
            raise InputError(f"{path}: invalid JSON array ({e}); fix the file") from None
        if not isinstance(data, list):
            raise InputError(f"{path}: a JSON file must hold an array of records")
        for rec in data:
            ok = _clean(rec, counter)
            if ok is not None:
                yield ok
        return
    for raw in capped_lines(f, counter, first=rest, lineno=blank):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            counter["invalid_utf8"] += 1
            continue
        try:
            rec = loads_json(line)
        except TooDeep:
            counter["too_deep"] += 1
            continue
        except ValueError:
            counter["malformed_json"] += 1
            continue
        ok = _clean(rec, counter)
        if ok is not None:
            yield ok


@reader("mtbench")
def read_mtbench(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """FastChat MT-Bench questions: ``question_id``, ``category``, ``turns[]`` (user turns)."""
    for rec in iter_json_records(path, counter):
        turns = rec.get("turns")
        if (
            not isinstance(turns, list)
            or not turns
            or not all(isinstance(t, str) and t for t in turns)
        ):
            counter["mtbench_no_turns"] += 1
            continue
        msgs = tuple(Message("user", t) for t in turns)
        yield make_prompt(
            dataset, msgs, question_id=rec.get("question_id"), category=rec.get("category")
        )


@reader("openai")
def read_openai_messages(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """OpenAI-messages JSONL: ``messages`` (and optional ``tools``) per line."""
    key = columns.get("messages", "messages")
    for rec in iter_json_records(path, counter):
        raw = rec.get(key)
        if not isinstance(raw, list) or not raw:
            counter["no_messages"] += 1
            continue
        try:
            msgs = messages_of(raw)
        except InputError:
            counter["bad_message"] += 1
            continue
        tools = rec.get(columns.get("tools", "tools")) or ()
        if not isinstance(tools, (list, tuple)):
            counter["bad_tools"] += 1
            continue
        meta = {k: rec[k] for k in ("id", "source") if k in rec}
        yield make_prompt(dataset, msgs, tuple(tools), **meta)


reader("openai-messages")(read_openai_messages)


def read_ground_truth(path: Path, counter: Counter[str]) -> list[GroundTruth]:
    """The records of a ground-truth JSONL file (see ../shared/data/groundtruth/README.md);
    a line that is not JSON or not a usable record is skipped and counted by why."""
    out: list[GroundTruth] = []
    for i, rec in enumerate(iter_json_records(path, counter)):
        try:
            out.append(ground_truth_of(rec, i))
        except InputError as e:
            counter[str(e)] += 1
    return out


def prompt_chars(p: Prompt) -> int:
    n = sum(len(m.content or "") + len(m.reasoning or "") for m in p.messages)
    n += sum(len(c.arguments) for m in p.messages for c in m.tool_calls)
    return n + (len(json.dumps(list(p.tools))) if p.tools else 0)


def read_prompts(
    path: Path,
    reader_name: str,
    dataset: str,
    columns: Mapping[str, str] | None = None,
    limit: int | None = None,
    max_chars: int | None = None,
) -> tuple[list[Prompt], Counter[str]]:
    """The prompts of one dataset, duplicates dropped; a prompt whose text (messages and tool
    schemas) passes ``max_chars`` is skipped as ``prompt_too_large`` (counted)."""
    counter: Counter[str] = Counter()
    out = list(iter_prompts(path, reader_name, dataset, counter, columns, limit, max_chars))
    return out, counter


def iter_prompts(
    path: Path,
    reader_name: str,
    dataset: str,
    counter: Counter[str],
    columns: Mapping[str, str] | None = None,
    limit: int | None = None,
    max_chars: int | None = None,
) -> Iterator[Prompt]:
    """``read_prompts`` one prompt at a time (what was skipped is counted in ``counter``): a
    run reads a dataset of any size into its ledger holding one prompt, not the dataset."""
    fn = READERS.get(reader_name)
    if fn is None:
        raise InputError(
            f"unknown reader {reader_name!r}; choose one of {', '.join(sorted(READERS))}"
        )
    seen: set[str] = set()
    for p in fn(path, dataset, columns or {}, counter):
        if max_chars is not None and prompt_chars(p) > max_chars:
            counter["prompt_too_large"] += 1
            continue
        if p.id in seen:
            counter["duplicate"] += 1
            continue
        seen.add(p.id)
        yield p
        if limit is not None and len(seen) >= limit:
            return
