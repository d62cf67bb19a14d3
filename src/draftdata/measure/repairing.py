"""Repairs beside validation: a server's scorer repairs several samples at once, and validation
hands each record on in order as its repair is done."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from ..errors import DraftdataError
from ..records import Decoding, GroundTruth, Sample, ValidationResult

__all__ = ["Measured", "Repaired", "Repairer", "refusal_key", "repaired"]


class Repaired(NamedTuple):
    """One sample's repair: its ids, the repairs made, the tokens the model forwarded, and the
    margin (nats) of each switch that was a bet (ours could have been drawn too)."""

    response: list[int]
    repairs: int
    tokens_forwarded: int
    bets: tuple[float, ...] = ()
    #: why the model could not repair it (its server refused to score it), as it is counted
    #: (``refusal_key``); "" where it did: the sample is then measured as reconstruction left it
    failed: str = ""


#: ``repairer(sample, decoding) -> Repaired``: the target model's repair of one reconstructed
#: sample (``model.sample_repair.sample_repairer``), injected so measuring stays free of torch
Repairer = Callable[[Sample, Decoding], Repaired]
#: a record, its reconstructed sample, and the sample measured against the record's ids
Measured = tuple[GroundTruth, Sample, ValidationResult]


def repaired(
    repairer: Repairer | None, items: Iterator[Measured], concurrency: int
) -> Iterator[tuple[Measured, Repaired | None]]:
    """Each item with the repair of its reconstructed sample (None for the rest), in order, up to
    ``concurrency`` repairs at once (a server's scorer; this process's model repairs one by one)
    and at most 4x that many items ahead of the one handed on."""
    if repairer is None:
        yield from ((m, None) for m in items)
        return
    fix = repairer
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        ahead: deque[tuple[Measured, Future[Repaired] | None]] = deque()
        for m in items:
            todo = m[1].token_source == "reconstructed"
            ahead.append((m, pool.submit(fix, m[1], m[0].decoding) if todo else None))
            while ahead and (len(ahead) > 4 * max(1, concurrency) or _done(ahead[0][1])):
                head, fut = ahead.popleft()
                yield head, _result(head, fut)
        for head, fut in ahead:
            yield head, _result(head, fut)


def _done(fut: Future[Any] | None) -> bool:
    return fut is None or fut.done()


def _result(m: Measured, fut: Future[Repaired] | None) -> Repaired | None:
    """The repair's outcome; one the model could not make (a server that refused the sample)
    is the sample unrepaired, with why: it never ends the measurement."""
    if fut is None:
        return None
    try:
        return fut.result()
    except DraftdataError as e:
        return Repaired(m[1].response_ids, 0, 0, failed=refusal_key(str(e)))


def refusal_key(failed: str) -> str:
    """A scorer's refusal as it is counted: its reason and the server's words, their numbers as
    N (``... refused to score 2088 ids (http_400): ...``)."""
    m = re.search(r"refused to score \d+ ids \(([\w.]+)\): (.*)", failed)
    reason, words = (m.group(1), m.group(2)) if m else ("", " ".join(failed.split()))
    words = re.sub(r"\d+", "N", words)[:160]
    return f"{reason}: {words}" if reason else words
