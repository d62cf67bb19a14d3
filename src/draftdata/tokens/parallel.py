"""The tokens stage over all cores: a run's stored answers, in windows, through forked workers.

The parent streams answers out of the ledger and writes what comes back, in submission order, so
the ledger ends the same whatever the number of workers; each worker holds the stage (forked,
with its tokenizer and format) and returns every answer's outcome ready to store: the sample's
columns already packed (its ids and mask compressed there, not in the parent), or the drop's
reason. At most two windows per worker are in flight."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from ..errors import DraftdataError, ReconstructError
from ..records import Answered, Drop, Sample, SampleRow
from .reconstruct import WINDOW
from .stage import TokensStage

#: stored answers at least this many use one worker per core (fewer: the fork costs more)
AUTO_ANSWERS = 4096

#: an answer's outcome: its sample's packed columns, or why it was dropped
Outcome = SampleRow | Drop

#: what a worker runs: the stage and how a sample is packed for storing (set before the fork)
_STAGE: list[tuple[TokensStage, Callable[[Sample], Any]]] = []


def jobs_for(n_answers: int, asked: int = 0) -> int:
    """``asked`` workers, or (0: auto) one per core for AUTO_ANSWERS answers or more."""
    if asked > 0:
        return asked
    cores = min(os.cpu_count() or 1, 8)
    return cores if n_answers >= AUTO_ANSWERS and cores > 1 else 1


def outcomes(
    stage: TokensStage,
    answers: Iterable[Answered],
    pack: Callable[[Sample], Any],
    jobs: int = 1,
    window: int = WINDOW,
) -> Iterator[Outcome]:
    """Every answer's outcome, in order: its sample packed by ``pack``, or its drop reason."""
    if jobs <= 1 or "fork" not in mp.get_all_start_methods():
        # (the stage travels to workers by fork: its tokenizer, its closures)
        yield from _outcomes(stage, pack, answers, window)
        return
    _STAGE[:] = [(stage, pack)]
    try:
        with mp.get_context("fork").Pool(jobs, initializer=_forget_threads) as pool:
            pending: deque[Any] = deque()
            it = iter(answers)
            while chunk := list(islice(it, window)):
                pending.append(pool.apply_async(_work, (chunk, window)))
                if len(pending) >= 2 * jobs:
                    yield from pending.popleft().get()
            while pending:
                yield from pending.popleft().get()
    finally:
        _STAGE.clear()


def _forget_threads() -> None:
    """A forked worker starts with the parent's thread pools, whose threads did not come along:
    it makes its own."""
    from ..tokenizers import base
    from . import reconstruct

    base._POOL = None
    reconstruct._ENCODER = None


def _work(chunk: list[Answered], window: int) -> list[Outcome]:
    stage, pack = _STAGE[0]
    return list(_outcomes(stage, pack, chunk, window))


def _outcomes(
    stage: TokensStage, pack: Callable[[Sample], Any], answers: Iterable[Answered], window: int
) -> Iterator[Outcome]:
    for key, got in stage.samples(answers, window):
        if isinstance(got, ReconstructError):
            yield Drop(key, got.reason)
        elif isinstance(got, DraftdataError):
            yield Drop(key, type(got).__name__)
        else:
            yield SampleRow(key, got.token_source, pack(got))
