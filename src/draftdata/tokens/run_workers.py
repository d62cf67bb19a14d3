"""The tokens stage over all cores: a run's stored answers, in windows, through forked workers.

The parent streams answers out of the ledger and writes what comes back, in submission order, so
the ledger ends the same whatever the number of workers; each worker holds the stage (forked,
with its tokenizer and format) and returns every answer's outcome ready to store: the sample's
columns already packed (its ids and mask compressed there, not in the parent), or the drop's
reason. At most two windows per worker are in flight (the pool is ``tokens.pool``, shared with
``reconstruct --jobs``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from typing import Any

from ..errors import DraftdataError, ReconstructError
from ..records import Answered, Drop, Sample, SampleRow
from ..tokenizers import fast_tiktoken
from . import pool
from .pool import AUTO_ANSWERS, jobs_for
from .reconstruct import WINDOW
from .sample_maker import TokensStage, windows

__all__ = ["AUTO_ANSWERS", "Outcome", "jobs_for", "outcomes"]

#: an answer's outcome: its sample's packed columns, or why it was dropped
Outcome = SampleRow | Drop

#: what a worker runs: the stage and how a sample is packed for storing (set before the fork)
_STAGE: list[tuple[TokensStage, Callable[[Sample], Any]]] = []


def outcomes(
    stage: TokensStage,
    answers: Iterable[Answered],
    pack: Callable[[Sample], Any],
    jobs: int = 1,
    window: int = WINDOW,
) -> Iterator[Outcome]:
    """Every answer's outcome, in order: its sample packed by ``pack``, or its drop reason."""
    if jobs <= 1 or not pool.can_fork():
        # (the stage travels to workers by fork: its tokenizer, its closures)
        yield from _outcomes(stage, pack, answers, window)
        return
    _STAGE[:] = [(stage, pack)]
    try:
        with closing(pool.ordered(_work, _windows(answers, window), jobs)) as results:
            for got in results:
                yield from got
    finally:
        _STAGE.clear()


def _windows(answers: Iterable[Answered], window: int) -> Iterator[tuple[list[Answered], int]]:
    for chunk in windows(answers, window):
        yield chunk, window


def _work(chunk: list[Answered], window: int) -> list[Outcome]:
    # gigatoken's piece cache and tables cost each worker 150-190 MB by the 40k rehearsal's
    # ultrachat set, for 10% of its time: the run's workers stay on tiktoken (same ids)
    fast_tiktoken.stay_on_tiktoken()
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
