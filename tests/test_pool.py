"""The one process pool (``tokens.pool``) that the tokens stage and ``reconstruct --jobs`` share,
and the bucket split that ``validate``/``learn --bucket`` take from ``tokens.prefs``."""

from __future__ import annotations

import os
import time

import pytest

from draftdata.tokens import pool
from draftdata.tokens.prefs import bucket_of, in_bucket


def test_jobs_for_takes_what_is_asked_else_one_per_core_for_enough_work():
    assert pool.jobs_for(0, 3) == 3
    assert pool.jobs_for(pool.AUTO_ANSWERS - 1) == 1
    assert pool.jobs_for(pool.AUTO_ANSWERS) == min(os.cpu_count() or 1, pool.MAX_AUTO)
    assert pool.jobs_for(100, 0, auto_at=100) == pool.jobs_for(pool.AUTO_ANSWERS)
    assert pool.jobs_for(99, 0, auto_at=100) == 1


def _slow_square(x: int) -> int:
    time.sleep(0.05 * (5 - x))  # the first tasks finish last
    return x * x


def test_results_come_back_in_task_order_whatever_the_workers_speed():
    got = list(pool.ordered(_slow_square, [(x,) for x in range(6)], 3))
    assert got == [x * x for x in range(6)]


_seen: list[int] = []


def _init(tag: int) -> None:
    _seen.append(tag)


def _encode_on_the_process_pools(n: int) -> tuple[list[int], int, list[int]]:
    """Work on both process-wide thread pools, with a deadline: a copy whose threads did not
    come along with the fork would never run it."""
    from draftdata.tokenizers import base
    from draftdata.tokens import reconstruct

    window = reconstruct._encoder().submit(lambda: n * 2).result(timeout=20)
    texts = ["x" * base.SERIAL_CHARS] * 4  # large enough to go to base's pool
    ids = base.encode_threaded(lambda t: [len(t)], texts)
    return _seen, window, [i[0] for i in ids]


@pytest.mark.skipif(not pool.can_fork(), reason="the hazard is a fork's")
def test_a_worker_forked_after_the_parent_used_its_thread_pools_makes_its_own():
    from draftdata.tokenizers import base
    from draftdata.tokens import reconstruct

    assert reconstruct._encoder().submit(lambda: 1).result() == 1  # the parent's threads exist
    base.encode_threaded(lambda t: [len(t)], ["x" * base.SERIAL_CHARS] * 4)
    got = list(pool.ordered(_encode_on_the_process_pools, [(n,) for n in range(4)], 2, _init, (7,)))
    assert [w for _, w, _ in got] == [0, 2, 4, 6]
    assert all(seen == [7] for seen, _, _ in got)
    assert all(ids == [base.SERIAL_CHARS] * 4 for _, _, ids in got)


def test_bucket_split_keeps_every_group_in_exactly_one_half():
    groups = [f"prompt-{i}" for i in range(500)]
    low = [g for g in groups if in_bucket(g, 0, 0.5)]
    high = [g for g in groups if in_bucket(g, 0.5, 1)]
    assert sorted(low + high) == sorted(groups) and 150 < len(low) < 350
    assert all(0 <= bucket_of(g) <= 1 for g in groups)
