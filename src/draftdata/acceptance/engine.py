"""Acceptance through the engine: a dataset's held-out requests sent to a vLLM server, and the
server's own spec-decode counters read before and after. The counters are server-wide, so the
measure holds only where the server served nothing else meanwhile: it must be idle before, and
after it must have finished exactly our requests and generated exactly our tokens, or the
measure is refused in one line."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import AcceptanceError
from ..records.acceptance import DatasetAcceptance
from . import metrics
from .held_out import EvalSet

#: seconds the counters may take to show the last answer (they are recorded by the server's
#: output loop, beside the answer); polled, not slept
SETTLE_S = 30.0
_POLL_S = 0.1


@dataclass(frozen=True)
class Answer:
    """One answer as the engine produced it: the prompt's ids as the server rendered them and
    the answer's ids (None where the server returns none), and why it ended."""

    prompt_ids: tuple[int, ...] | None
    ids: tuple[int, ...] | None
    completion_tokens: int
    finish: str


@dataclass(frozen=True)
class Asked:
    """What every request of a measure shares."""

    url: str
    model: str
    temperature: float
    max_tokens: int
    concurrency: int
    timeout_s: float = 600.0


def served_model(url: str, timeout: float = 30.0) -> str:
    """The first model the server lists (``GET /v1/models``)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout) as r:
            doc = json.loads(r.read())
        return str(doc["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise AcceptanceError(
            f"{url}/models: no model listed ({e}); point --server at a vLLM server's /v1"
        ) from e


def _post(a: Asked, body: dict[str, Any]) -> Answer | str:
    req = {
        **body,
        "model": a.model,
        "temperature": a.temperature,
        "max_tokens": a.max_tokens,
        "seed": 0,
        "return_token_ids": True,
    }
    data = json.dumps(req).encode()
    r = urllib.request.Request(
        a.url.rstrip("/") + "/chat/completions",
        data=data,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(r, timeout=a.timeout_s) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return f"http_{e.code}"
    except (urllib.error.URLError, OSError) as e:
        raise AcceptanceError(f"{a.url}: the server stopped answering ({e}); check its log") from e
    choice = doc["choices"][0]
    ids = choice.get("token_ids")
    prompt = doc.get("prompt_token_ids") or choice.get("prompt_token_ids")
    usage = doc.get("usage") or {}
    n = usage.get("completion_tokens")
    return Answer(
        tuple(int(t) for t in prompt) if isinstance(prompt, list) else None,
        tuple(int(t) for t in ids) if isinstance(ids, list) else None,
        int(n) if isinstance(n, int) else len(ids or ()),
        str(choice.get("finish_reason") or ""),
    )


def _settled(url: str, before: metrics.Counters, served: int) -> metrics.Counters:
    """The counters once they show ``served`` more finished requests and stop moving."""
    deadline = time.monotonic() + SETTLE_S
    last = metrics.read(url)
    while time.monotonic() < deadline:
        if last.finished - before.finished >= served and last.busy() == 0:
            again = metrics.read(url)
            if again == last:
                return again
            last = again
        else:
            time.sleep(_POLL_S)
            last = metrics.read(url)
    return last


def measure(
    a: Asked,
    es: EvalSet,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[DatasetAcceptance, list[Answer], dict[str, int]]:
    """Send ``es``'s requests and read what the server counted for them: the dataset's
    acceptance (engine counts; None where the server drafts nothing), the answers in request
    order, and the requests it refused (by HTTP status)."""
    before = metrics.read(a.url)
    if before.busy():
        raise AcceptanceError(
            f"{a.url}: the server is serving {before.busy()} other requests; its spec-decode "
            "counters are server-wide, so measure on a server no one else uses"
        )
    t0 = time.monotonic()
    got: list[Answer | str] = []
    # not ``with``: on an exit (Ctrl-C, SIGTERM) the requests in flight are not waited for, so
    # the server that holds them can be stopped at once
    pool = ThreadPoolExecutor(max_workers=max(1, a.concurrency), thread_name_prefix="evaluate")
    try:
        for i, r in enumerate(pool.map(lambda b: _post(a, b), es.requests), 1):
            got.append(r)
            if progress is not None:
                progress(i, len(es.requests))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    wall = time.monotonic() - t0
    answers = [r for r in got if isinstance(r, Answer)]
    refused = dict(Counter(r for r in got if isinstance(r, str)))
    after = _settled(a.url, before, len(answers))
    served = after.finished - before.finished
    tokens = sum(x.completion_tokens for x in answers)
    generated = after.generation_tokens - before.generation_tokens
    if served != len(answers) or generated != tokens:
        raise AcceptanceError(
            f"{a.url}: while {es.name} was measured the server finished {served} requests and "
            f"generated {generated} tokens, ours were {len(answers)} and {tokens}: someone else "
            "used it, and its counters are server-wide; measure on a server no one else uses"
        )
    spec = after.spec - before.spec if after.speculating else None
    row = DatasetAcceptance(es.name, len(answers), tokens, wall, spec)
    return row, answers, refused
