"""Fault injection for the replay server: the ``--faults`` spec (``parse_faults``), the
seeded per-request choice (``choose_fault``), the fault kinds and what the content faults inject.

The fault for a request is a pure function of ``(seed, record id, attempt)``, so two servers with
the same seed and spec serve the same fault sequence for each record.

The kinds, by what a client sees:

- status errors with an OpenAI-style error body: ``429`` (with ``Retry-After``), ``500``, and
  ``401`` / ``403`` (a wrong or unauthorised key: drawn once per record, then on every attempt);
- broken transport: ``slow`` (the whole answer waits ``--slow-seconds``), ``truncated`` (a
  complete body of half the JSON), ``cut`` (Content-Length of the whole body, half of it sent,
  then the connection is closed), ``slowbody`` (status and headers at once, then the body
  trickles for longer than ``--slow-seconds``); ``slow`` and ``slowbody`` on attempt 1 only;
- odd 200 answers: ``empty`` content, ``length`` (half the content, finish_reason length),
  ``reasoning`` and ``tools`` fields, ``badtools`` (``tool_calls`` not a list), ``strmessage``
  (``message`` is a string), ``nousage`` (no ``usage``), ``overlong`` (content far past
  ``max_tokens``) and ``huge`` (about 16 MiB of content).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from ..errors import InputError

#: fault kinds, in the order their rates are stacked when a request's draw is walked; new kinds
#: go at the end, so that a spec without them keeps its seeds' fault sequences
FAULT_KINDS = (
    "429",
    "500",
    "slow",
    "truncated",
    "empty",
    "length",
    "reasoning",
    "tools",
    "cut",
    "slowbody",
    "401",
    "403",
    "badtools",
    "strmessage",
    "nousage",
    "overlong",
    "huge",
)
#: served on attempt 1 only; a later attempt that draws one gets no fault
FIRST_ATTEMPT_ONLY = frozenset({"slow", "slowbody"})
#: drawn once per record (by the attempt-1 draw) and then served on every attempt
PER_RECORD = frozenset({"401", "403"})
#: content of every injected reasoning field
REASONING_TEXT = "Let me think."
#: the provider shapes the ``reasoning`` fault rotates through
REASONING_SHAPES = ("reasoning_content", "reasoning", "reasoning_details")
INJECTED_TOOL_CALL: dict[str, Any] = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
}
_RATE_SUM_SLACK = 1e-9


def parse_faults(spec: str | None) -> dict[str, float]:
    """``"429=0.2,500=0.1,empty=0.05"`` -> ``{"429": 0.2, "500": 0.1, "empty": 0.05}``.

    Rates lie in [0, 1] and sum to at most 1; the result is in ``FAULT_KINDS`` order, so the
    spec's own order does not change which fault a draw lands on. ``None`` or "" means no faults.
    """
    out: dict[str, float] = {}
    if spec is None or not spec.strip():
        return out
    valid = ", ".join(FAULT_KINDS)
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        kind, sep, value = item.partition("=")
        kind = kind.strip()
        if not sep:
            raise InputError(f"--faults item {item!r}: write KIND=RATE, e.g. 429=0.1")
        if kind not in FAULT_KINDS:
            raise InputError(f"--faults item {item!r}: unknown fault kind {kind!r}; valid: {valid}")
        if kind in out:
            raise InputError(f"--faults item {item!r}: {kind} is given twice; give it once")
        try:
            rate = float(value)
        except ValueError:
            raise InputError(
                f"--faults item {item!r}: {value.strip()!r} is not a number; give a rate in [0, 1]"
            ) from None
        if not (0.0 <= rate <= 1.0):  # also refuses NaN
            raise InputError(f"--faults item {item!r}: rate {rate} is outside [0, 1]")
        out[kind] = rate
    total = math.fsum(out.values())
    if total > 1.0 + _RATE_SUM_SLACK:
        raise InputError(
            f"--faults {spec!r}: rates sum to {total:g}, more than 1; lower some rates"
        )
    return {k: out[k] for k in FAULT_KINDS if k in out}


def choose_fault(
    faults: Mapping[str, float], seed: int, record_id: str, attempt: int
) -> str | None:
    """The fault kind for this ``(seed, record, attempt)``, or None: one uniform draw from
    ``random.Random(f"{seed}:{record_id}:{attempt}")`` walked over the cumulative rates.

    ``slow`` and ``slowbody`` apply on attempt 1 only; a later attempt that draws one gets no
    fault. ``401`` and ``403`` are decided by the attempt-1 draw alone: a record whose first
    draw lands on one gets it on every attempt (a wrong key stays wrong), and a later attempt
    whose own draw lands on one gets no fault, so each is served to ``rate`` of the records."""
    if not faults:
        return None
    first = _walk(faults, seed, record_id, 1)
    if first in PER_RECORD:
        return first
    kind = first if attempt == 1 else _walk(faults, seed, record_id, attempt)
    if kind in PER_RECORD or (kind in FIRST_ATTEMPT_ONLY and attempt > 1):
        return None
    return kind


def _walk(faults: Mapping[str, float], seed: int, record_id: str, attempt: int) -> str | None:
    u = random.Random(f"{seed}:{record_id}:{attempt}").random()
    cum = 0.0
    for kind in FAULT_KINDS:
        rate = faults.get(kind, 0.0)
        if rate <= 0.0:
            continue
        cum += rate
        if u < cum:
            return kind
    return None
