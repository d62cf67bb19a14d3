"""The one process pool of the tokens stage: how many workers, how they start, and the order
their results come back in.

Both users go through here: ``draftdata reconstruct --jobs`` (chunks of an input file, each
worker loading the tokenizer itself) and a run's tokens stage (``tokens.run_workers``, the stage
travelling to the workers by fork). Results come back in submission order whatever the workers'
speed, so the output is the same for any number of workers; at most two tasks per worker are in
flight, so memory holds those and the one result being used."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar

R = TypeVar("R")

#: the most workers ``jobs_for`` picks on its own (past this the parent's writing is the limit)
MAX_AUTO = 8
#: stored answers at least this many use one worker per core (fewer: the fork costs more)
AUTO_ANSWERS = 4096


def jobs_for(work: int, asked: int = 0, auto_at: int = AUTO_ANSWERS) -> int:
    """``asked`` workers, or (0: auto) one per core, at most MAX_AUTO, for ``work`` of at least
    ``auto_at`` (stored answers unless the caller counts something else, such as an input's
    bytes), else one: on little work the workers' start costs more than they save."""
    if asked > 0:
        return asked
    cores = min(os.cpu_count() or 1, MAX_AUTO)
    return cores if work >= auto_at else 1


def can_fork() -> bool:
    """Whether workers can be forked here (they then inherit what this process holds)."""
    return "fork" in mp.get_all_start_methods()


def ordered(
    work: Callable[..., R],
    tasks: Iterable[tuple[Any, ...]],
    jobs: int,
    init: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
) -> Generator[R, None, None]:
    """``work(*task)`` for each task in ``jobs`` worker processes, yielded in task order. Each
    worker runs ``init(*initargs)`` once first. Workers are forked where the platform allows it,
    else spawned (then ``work`` and ``init`` must be module-level functions, ``initargs``
    picklable)."""
    ctx = mp.get_context("fork" if can_fork() else "spawn")
    with ctx.Pool(jobs, initializer=_start, initargs=(init, initargs)) as pool:
        pending: deque[Any] = deque()
        for task in tasks:
            pending.append(pool.apply_async(work, task))
            if len(pending) >= 2 * jobs:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _start(init: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    """A worker's first act: forget the parent's thread pools, then the caller's ``init``.

    A forked worker starts with copies of this process's thread pools (the tokenizer's batch
    encode pool, reconstruction's window encoder) but none of their threads: work submitted to a
    copy waits forever. Two fixes existed: fork before the parent has loaded a tokenizer (what
    ``reconstruct --jobs`` relied on), or drop the copies in each worker, which then makes its
    own on first use (what the tokens stage did). The second is kept: it holds whatever the
    parent did before the fork, so it does not depend on call order, and it lets a stage that
    is already loaded travel to the workers by fork. It also runs in a worker the pool starts
    again later (after one dies), when the parent may well hold threads. (The parent's pools are
    idle at the fork: the pool forks its workers in its constructor, before any task exists.)"""
    from ..tokenizers import base
    from ..tokenizers.fast_tiktoken import without_awkward
    from . import reconstruct

    base._POOL = None
    reconstruct._ENCODER = None
    without_awkward()  # a worker runs only our tasks: gigatoken's import of it is 0.12 s each
    if init is not None:
        init(*initargs)
