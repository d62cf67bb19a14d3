"""Retry policy as pure functions and named constants (openai-python style): honour Retry-After
(and retry-after-ms), otherwise exponential backoff with jitter."""

from __future__ import annotations

import random
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import NamedTuple

from .http11 import Reply
from .streaming import StreamWatch

RETRY_STATUSES = frozenset({408, 409, 429})
#: answers with status 200 whose body was not a usable completion: retried like a timeout
RETRY_REASONS = frozenset({"http_200_invalid_json", "no_choices", "empty_response", "stream_error"})
#: the capability probe's expected refusal of vLLM's return_token_ids (not a failure)
PROBE_REFUSED = "capability_probe_refused"
#: a server's refusal of ``stream: true`` where the manifest left streaming to draftdata
STREAM_REFUSED = "stream_refused"
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 60.0
JITTER = 0.25
MAX_RETRY_AFTER_S = 120.0


def should_retry(status: int | None) -> bool:
    """Retry on connection errors / timeouts (status None), 408, 409, 429 and 5xx."""
    return status is None or status in RETRY_STATUSES or status >= 500


#: statuses that no retry fixes: the key is wrong or lacks access; the dataset stops at once
AUTH_STATUSES = frozenset({401, 403})


def will_retry(reason: str, status: int | None, attempt: int, max_retries: int) -> bool:
    """Whether a failed attempt (``attempt`` counts from 0) is tried again. Decided by what
    happened, not only by the status line: a body cut mid-stream or slower than the timeout
    arrives after a 200 and is retried like any timeout or broken connection."""
    if attempt >= max_retries or status in AUTH_STATUSES:
        return False
    if reason == "timeout" or reason.startswith("connection_error"):
        return True
    return reason in RETRY_REASONS or should_retry(status)


def retry_after(
    headers: Mapping[str, str] | None, now: float | None = None, cap: float = MAX_RETRY_AFTER_S
) -> float | None:
    """The wait a server asks for (Retry-After, retry-after-ms), at most ``cap`` seconds."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, min(float(ms) / 1000.0, cap))
        except ValueError:
            pass
    ra = lower.get("retry-after")
    if ra is None:
        return None
    try:
        return max(0.0, min(float(ra), cap))
    except ValueError:
        try:
            import time

            when = parsedate_to_datetime(ra).timestamp()
            return max(0.0, min(when - (now if now is not None else time.time()), cap))
        except (TypeError, ValueError):
            return None


def backoff(attempt: int, rng: random.Random, initial: float = INITIAL_BACKOFF_S) -> float:
    """Exponential backoff for attempt 0, 1, 2, ... from ``initial`` seconds, with up to JITTER
    of it taken off."""
    base: float = min(initial * (2.0**attempt), MAX_BACKOFF_S)
    return base * (1.0 - JITTER * rng.random())


def retry_delay(
    attempt: int,
    headers: Mapping[str, str] | None,
    rng: random.Random,
    initial: float = INITIAL_BACKOFF_S,
) -> float:
    ra = retry_after(headers)
    return ra if ra is not None else backoff(attempt, rng, initial)


class Sent(NamedTuple):
    """One attempt on the wire: when it left (``t0``, epoch seconds) and how long it took, the
    status, headers and text that came back, the reply itself (None: none came), the reason it
    failed (None: a reply to read), the server's error detail, and the stream's reader (None:
    not streamed)."""

    t0: float
    latency: float
    status: int | None
    headers: dict[str, str]
    text: str | None
    reply: Reply | None
    reason: str | None
    detail: str
    watch: StreamWatch | None
    #: the connection never opened: nothing reached the server, nothing can be billed
    unsent: bool = False


def refused_option(sent: Sent, probing: bool, stream_left_to_us: bool) -> str | None:
    """The option a server refused, to turn off for every later request: its ids on the
    capability probe (``PROBE_REFUSED``), or streaming where the manifest left it to draftdata
    (``STREAM_REFUSED``); None if none."""
    status, text = sent.status, sent.text
    if status not in (400, 422) or not text:
        return None
    if probing and "return_token_ids" in text:
        return PROBE_REFUSED
    if stream_left_to_us and "stream" in text.lower():
        return STREAM_REFUSED
    return None
