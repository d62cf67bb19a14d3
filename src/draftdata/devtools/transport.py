"""The replay server's transport faults, as Starlette responses that misbehave on the wire.

- ``CutResponse`` (``cut``): the status line and a Content-Length for the whole body, half of
  the body, then the connection is closed: a client sees a short body (aiohttp raises
  ``ClientPayloadError``). The close is uvicorn's answer to an app that raises after the
  response started; ``InjectedCut`` is that exception, and ``hide_injected_cuts`` keeps
  uvicorn from logging each one as an application error.
- ``TrickleResponse`` (``slowbody``): status and headers at once, then the body in
  ``TRICKLE_PIECES`` pieces, each after a pause, so that the body takes longer than
  ``--slow-seconds`` and a client's timeout runs out mid-body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

#: the logger uvicorn reports application errors on
UVICORN_ERROR_LOGGER = "uvicorn.error"
#: ``slowbody`` sends its body in this many pieces: the first with the headers, each other one
#: ``TRICKLE_GAP`` x ``--slow-seconds`` after the one before (1.5 x ``--slow-seconds`` in all)
TRICKLE_PIECES = 4
TRICKLE_GAP = 0.5


class InjectedCut(Exception):
    """Raised by ``CutResponse`` after half its body: uvicorn closes the connection."""


class _HideInjectedCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], InjectedCut))


def hide_injected_cuts() -> None:
    """Drop uvicorn's "Exception in ASGI application" records for ``InjectedCut`` (only those).
    Idempotent; call it after uvicorn has configured its logging."""
    logger = logging.getLogger(UVICORN_ERROR_LOGGER)
    if not any(isinstance(f, _HideInjectedCuts) for f in logger.filters):
        logger.addFilter(_HideInjectedCuts())


async def client_gone(receive: Receive, seconds: float) -> bool:
    """Wait ``seconds``, or less if the client hangs up first; True if it did. A slow answer
    nobody waits for must not hold the server's shutdown."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(gone(), timeout=seconds)
        return True
    return False


class CutResponse(Response):
    """Headers for the whole body (its Content-Length included), half the body, then a closed
    connection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        half = bytes(self.body[: len(self.body) // 2])
        await send({"type": "http.response.body", "body": half, "more_body": True})
        raise InjectedCut(f"injected fault: connection closed after {len(half)} body bytes")


class TrickleResponse(Response):
    """Headers at once, then the body in ``TRICKLE_PIECES`` pieces ``gap_s`` apart; stops early
    if the client hangs up."""

    def __init__(
        self,
        content: bytes,
        gap_s: float,
        status_code: int = 200,
        headers: dict[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        super().__init__(content, status_code, headers, media_type)
        self.gap_s = gap_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        body, n = bytes(self.body), TRICKLE_PIECES
        cuts = [len(body) * i // n for i in range(n + 1)]
        for i in range(n):
            if i and await client_gone(receive, self.gap_s):
                return
            await send(
                {
                    "type": "http.response.body",
                    "body": body[cuts[i] : cuts[i + 1]],
                    "more_body": i < n - 1,
                }
            )
