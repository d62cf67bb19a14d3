"""`reconstruct` over several processes: a large input split into chunks of lines, each chunk
parsed and reconstructed by a worker, the samples written by this process in input order.

The order is the input's whatever the workers' speed (results are taken in submission order);
memory is bounded (at most two chunks per worker are in flight, and this process holds only
the chunk it is writing). Each worker loads the tokenizer and format once. Workers are forked
where the platform allows it, before this process has loaded a tokenizer (a tokenizer's
thread pool does not survive a fork)."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from ..errors import DraftdataError, InputError
from ..records import Sample

#: input lines per task: one batched-encode window (`tokens.reconstruct.WINDOW`), small enough
#: that the last chunks keep every worker busy to the end
CHUNK = 512
#: an input at least this large is split across processes when ``--jobs`` is left to auto
AUTO_BYTES = 8 << 20

_state: dict[str, Any] = {}


def jobs_for(path: Path, asked: int) -> int:
    """``asked`` processes, or (0: auto) one per core for an input of AUTO_BYTES or more."""
    if asked > 0:
        return asked
    try:
        big = path.stat().st_size >= AUTO_BYTES
    except OSError:
        return 1  # the reader names a missing file
    return min(os.cpu_count() or 1, 8) if big else 1


def _init(setup: dict[str, Any]) -> None:
    from .tokens import _applier, _bound

    try:
        bound = _bound(setup["tokenizer"], setup["format"], setup["chat_template"])
        _state["bound"] = bound
        _state["output"] = setup["output"]
        _state["server"] = setup.get("server", "auto")
        _state["text_ids"] = _applier(setup["prefs"], bound)
    except DraftdataError as e:
        _state["error"] = str(e)  # said by the first task, in the parent


def _work(
    lines: list[str], all_turns: bool, thinking: bool | None
) -> tuple[Any, int, dict[str, int], dict[str, int], dict[str, int]]:
    """One chunk: its samples encoded for the output file (so this process only writes), their
    number, samples by token source, drops by reason and skipped lines by reason."""
    from ..export.shards import encode_piece
    from .app import jsonl_records

    if "error" in _state:
        raise InputError(_state["error"])
    skipped: dict[str, int] = {}
    drops: dict[str, int] = {}
    sources: dict[str, int] = {}
    records = jsonl_records(lines, skipped)
    got = samples_of(
        _state["bound"], records, drops, all_turns, thinking, _state["text_ids"], _state["server"]
    )
    piece, n = encode_piece(_counted(got, sources), _state["output"])
    return piece, n, sources, drops, skipped


def _counted(samples: Iterable[Sample], sources: dict[str, int]) -> Iterator[Sample]:
    for s in samples:
        count_sample(s, sources)
        yield s


def count_sample(s: Sample, counts: dict[str, int]) -> None:
    """A written sample counted by token source, and by what its server's view lost."""
    counts[s.token_source] = counts.get(s.token_source, 0) + 1
    for w in s.warnings:
        if w.startswith("lossy:"):
            counts[w] = counts.get(w, 0) + 1


def samples_of(
    bound: Any,
    records: Iterable[dict[str, Any]],
    drops: dict[str, int],
    all_turns: bool,
    thinking: bool | None,
    text_ids: Any,
    server: str = "auto",
) -> Iterator[Sample]:
    """The samples of ``records`` in order; each record that gives none is counted in
    ``drops`` by its reason (one process, or one chunk of a worker)."""
    from ..tokens.reconstruct import reconstruct_many
    from .tokens import _items

    items = _items(iter(records), drops, all_turns, server)
    for s in reconstruct_many(bound, items, thinking=thinking, text_ids=text_ids):
        if isinstance(s, DraftdataError):
            reason = getattr(s, "reason", None) or f"bad_record:{s}"
            drops[reason] = drops.get(reason, 0) + 1
        else:
            yield s


def reconstruct_jobs(
    path: Path,
    setup: dict[str, Any],
    jobs: int,
    all_turns: bool,
    thinking: bool | None,
) -> Iterator[tuple[Any, int, dict[str, int], dict[str, int], dict[str, int]]]:
    """Each chunk's ``_work`` result, in input order. ``setup`` names the tokenizer, format,
    chat template, preferences and the output file (its suffix says how pieces are encoded)."""
    from .app import open_jsonl

    f = open_jsonl(path)  # a line that is not UTF-8 is counted by the worker that parses it
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else "spawn")
    with f, ctx.Pool(jobs, initializer=_init, initargs=(setup,)) as pool:
        pending: deque[Any] = deque()
        while chunk := list(islice(f, CHUNK)):
            pending.append(pool.apply_async(_work, (chunk, all_turns, thinking)))
            if len(pending) >= 2 * jobs:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
