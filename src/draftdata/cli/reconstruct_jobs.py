"""`reconstruct` over several processes: a large input split into chunks of lines, each chunk
parsed and reconstructed by a worker, the samples written by this process in input order.

The pool is the tokens stage's (``tokens.pool``): results in submission order whatever the
workers' speed, at most two chunks per worker in flight, this process holding only the chunk it
is writing. Each worker loads the tokenizer and format once (so a spawned worker works too)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DraftdataError, InputError
from ..records import PackedSample, Sample
from ..tokens import pool

if TYPE_CHECKING:
    from ..tokens.target import Target

#: input lines per task: one batched-encode window (`tokens.reconstruct.WINDOW`), small enough
#: that the last chunks keep every worker busy to the end
CHUNK = 512
#: an input at least this large is split across processes when ``--jobs`` is left to auto
AUTO_BYTES = 8 << 20

_state: dict[str, Any] = {}


def input_bytes(path: Path) -> int:
    """The input's size, what ``--jobs 0`` goes by (``tokens.pool.jobs_for``, at AUTO_BYTES)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the reader names a missing file


def target_of(setup: dict[str, Any], strict: bool = True) -> Target:
    """The target ``setup`` names (``tokenizer``, ``format``, ``chat_template``, ``prefs``,
    ``thinking``), loaded here: what the tokens commands and each worker of
    ``reconstruct_jobs`` encode with."""
    from ..tokens.target import load_target

    return load_target(
        setup["tokenizer"],
        setup["format"],
        setup.get("prefs"),
        thinking=setup.get("thinking"),
        chat_template=setup.get("chat_template"),
        strict=strict,
    )


def _init(setup: dict[str, Any]) -> None:
    try:
        _state["target"] = target_of(setup)
        _state["output"] = setup["output"]
        _state["server"] = setup.get("server", "auto")
    except DraftdataError as e:
        _state["error"] = str(e)  # said by the first task, in the parent


def _work(
    lines: list[str], all_turns: bool
) -> tuple[Any, int, dict[str, int], dict[str, int], dict[str, int]]:
    """One chunk: its samples encoded for the output file (so this process only writes), their
    number, samples by token source, drops by reason and skipped lines by reason."""
    from ..export.shards import encode_piece, takes_arrays
    from ..tokens.answers import samples_of
    from .app import jsonl_records

    if "error" in _state:
        raise InputError(_state["error"])
    skipped: dict[str, int] = {}
    drops: dict[str, int] = {}
    sources: dict[str, int] = {}
    records = jsonl_records(lines, skipped)
    packed = takes_arrays(Path(_state["output"]))
    got = samples_of(_state["target"], records, drops, all_turns, _state["server"], packed)
    piece, n = encode_piece(_counted(got, sources), _state["output"])
    return piece, n, sources, drops, skipped


def _counted(
    samples: Iterable[Sample | PackedSample], sources: dict[str, int]
) -> Iterator[Sample | PackedSample]:
    from ..tokens.answers import count_sample

    for s in samples:
        count_sample(s, sources)
        yield s


def reconstruct_jobs(
    path: Path,
    setup: dict[str, Any],
    jobs: int,
    all_turns: bool,
    skipped: dict[str, int],
) -> Iterator[tuple[Any, int, dict[str, int], dict[str, int], dict[str, int]]]:
    """Each chunk's ``_work`` result, in input order. ``setup`` names the target
    (``target_of``) and the output file (its suffix says how pieces are encoded);
    lines past the cap are counted in ``skipped`` as they are read."""
    from .app import open_jsonl, text_lines

    f = open_jsonl(path)  # a line that is not UTF-8 is counted by the worker that parses it
    with f:
        lines = text_lines(f, skipped)  # a line past the cap is counted here
        chunks = iter(lambda: list(islice(lines, CHUNK)), [])
        tasks = ((chunk, all_turns) for chunk in chunks)
        yield from pool.ordered(_work, tasks, jobs, _init, (setup,))
