"""An OpenAI-compatible chat-completions server that replays ground-truth records.

Backends, retry policy and reconstruction are tested against real HTTP on loopback instead of
mocks: this server answers ``POST /v1/chat/completions`` with the ground-truth generation whose
messages equal the request's, and injects faults at seeded, reproducible rates: error statuses
(429, 500, 401, 403), broken transport (slow answers, truncated bodies, connections cut
mid-body, bodies that trickle), and odd answers (empty or cut content, reasoning fields, tool
calls, malformed tool calls or messages, no usage, content past max_tokens, a 16 MiB answer).
``faults`` lists the kinds; ``answers`` and ``transport`` build the faulty answers.

The fault for a request is a pure function of ``(seed, record id, attempt)``, where ``attempt``
counts the requests this server has seen for that record (1 for the first): two servers with the
same seed and fault spec serve the same fault sequence for each record, whatever the order of
records in between.

With ``token_ids`` on, a request carrying ``"return_token_ids": true`` (the vLLM extension) also
gets ``prompt_token_ids`` and ``choices[0].token_ids``, exactly as in the record. The choice ids
are left out whenever a fault changed the message (every message fault but ``nousage``), so
altered text never arrives paired with ids that do not describe it.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import DraftdataError, InputError
from .answers import MESSAGE_FAULTS, fault_tail
from .faults import (
    FAULT_KINDS,
    INJECTED_TOOL_CALL,
    REASONING_SHAPES,
    REASONING_TEXT,
    choose_fault,
    parse_faults,
)
from .replay_records import ReplayRecord, _dumps, load_records, message_key
from .transport import TRICKLE_GAP, CutResponse, TrickleResponse, client_gone, hide_injected_cuts

__all__ = [
    "ERROR_FAULTS",
    "FAULT_HEADER",
    "FAULT_KINDS",
    "INJECTED_TOOL_CALL",
    "REASONING_SHAPES",
    "REASONING_TEXT",
    "RECORD_HEADER",
    "RETRY_AFTER_MS",
    "RETRY_AFTER_S",
    "SHUTDOWN_GRACE_S",
    "ReplayRecord",
    "choose_fault",
    "load_records",
    "make_app",
    "message_key",
    "parse_faults",
    "serve",
    "serve_in_thread",
]

RETRY_AFTER_S = "1"
RETRY_AFTER_MS = "50"
RECORD_HEADER = "x-replay-record"
FAULT_HEADER = "x-replay-fault"
#: how long a stopping server waits for answers in flight (a slow answer may be among them)
SHUTDOWN_GRACE_S = 2
#: the status faults: kind -> (status, error message, error type, error code); 401 has
#: OpenAI's string code, the others the integer status as OpenRouter sends it
ERROR_FAULTS: dict[str, tuple[int, str, str, int | str]] = {
    "429": (429, "rate limit reached (injected fault)", "rate_limit_error", 429),
    "500": (500, "internal server error (injected fault)", "server_error", 500),
    "401": (
        401,
        "Incorrect API key provided (injected fault); check the key",
        "invalid_request_error",
        "invalid_api_key",
    ),
    "403": (
        403,
        "this key is not allowed to use this model (injected fault)",
        "authentication_error",
        403,
    ),
}


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    """The request's completion budget (``max_tokens``, else ``max_completion_tokens``)."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _error_body(message: str, kind: str, code: int | str | None = None) -> bytes:
    err: dict[str, Any] = {"message": message, "type": kind}
    if code is not None:
        err["code"] = code
    return _dumps({"error": err}).encode()


# ---------------------------------------------------------------- the app


class _Replay:
    """Index, counters and handlers of one server. Single event loop: no locks needed."""

    def __init__(
        self,
        records: Iterable[Mapping[str, Any] | ReplayRecord],
        faults: Mapping[str, float],
        seed: int,
        token_ids: bool,
        slow_seconds: float,
        skipped: Mapping[str, int],
    ) -> None:
        self.faults = dict(faults)
        self.seed = seed
        self.token_ids = token_ids
        self.slow_seconds = slow_seconds
        self.skipped = dict(skipped)
        self.by_key: dict[str, list[ReplayRecord]] = {}
        self.loaded = 0
        bad = 0
        ids: set[str] = set()
        for raw in records:
            try:
                rec = raw if isinstance(raw, ReplayRecord) else ReplayRecord.from_mapping(raw)
            except InputError:
                bad += 1
                continue
            if rec.id in ids:
                self.skipped["duplicate_id"] = self.skipped.get("duplicate_id", 0) + 1
                continue
            ids.add(rec.id)
            self.by_key.setdefault(rec.key, []).append(rec)
            self.loaded += 1
        if bad:
            self.skipped["bad_record"] = self.skipped.get("bad_record", 0) + bad
        if not self.loaded:
            raise InputError(
                "no usable ground-truth records (each needs id, messages, prompt_ids, "
                "output_ids and api_view.content); check the input file"
            )
        self.attempts: dict[str, int] = {}
        self.requests = 0
        self.by_status: dict[str, int] = {}
        self.fault_counts: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
        #: slow answers whose client hung up before they came
        self.hung_up = 0

    # -- helpers

    def _answer(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        fault: str | None = None,
    ) -> Response:
        key = str(status)
        self.by_status[key] = self.by_status.get(key, 0) + 1
        kw: dict[str, Any] = {"status_code": status, "headers": headers}
        if fault == "cut":
            return CutResponse(body, media_type="application/json", **kw)
        if fault == "slowbody":
            gap = TRICKLE_GAP * self.slow_seconds
            return TrickleResponse(body, gap, media_type="application/json", **kw)
        return Response(body, media_type="application/json", **kw)

    @staticmethod
    def _pick(candidates: list[ReplayRecord], temperature: float) -> ReplayRecord:
        suffix = "-greedy" if temperature == 0 else "-sample"
        for rec in candidates:
            if rec.id.endswith(suffix):
                return rec
        return candidates[0]

    # -- endpoints

    async def chat(self, request: Request) -> Response:
        self.requests += 1
        n = self.requests
        try:
            body = json.loads(await request.body())
        except ValueError:
            return self._answer(
                400, _error_body("request body is not valid JSON", "invalid_request_error")
            )
        if not isinstance(body, dict):
            return self._answer(
                400, _error_body("request body must be a JSON object", "invalid_request_error")
            )
        if body.get("stream") is True:
            return self._answer(
                400,
                _error_body(
                    "streaming is not supported by replay-server; send stream: false",
                    "invalid_request_error",
                ),
            )
        temperature = body.get("temperature")
        if temperature is None:
            temperature = 0.0
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
            return self._answer(
                400, _error_body("'temperature' must be a number", "invalid_request_error")
            )
        try:
            key = message_key(body.get("messages"))
        except ValueError as e:
            return self._answer(400, _error_body(str(e), "invalid_request_error"))
        candidates = self.by_key.get(key)
        if candidates is None:
            return self._answer(
                404, _error_body("no ground-truth record for these messages", "not_found")
            )
        rec = self._pick(candidates, float(temperature))
        attempt = self.attempts.get(rec.id, 0) + 1
        self.attempts[rec.id] = attempt
        fault = choose_fault(self.faults, self.seed, rec.id, attempt)
        headers = {RECORD_HEADER: rec.id}
        if fault is not None:
            self.fault_counts[fault] += 1
            headers[FAULT_HEADER] = fault
        if fault in ERROR_FAULTS:
            status, message, kind, code = ERROR_FAULTS[fault]
            if fault == "429":
                headers["Retry-After"] = RETRY_AFTER_S
                headers["retry-after-ms"] = RETRY_AFTER_MS
            return self._answer(status, _error_body(message, kind, code), headers)
        if fault == "slow" and await client_gone(request.receive, self.slow_seconds):
            self.hung_up += 1  # the client left before the slow answer came
        model = body.get("model")
        head = (
            f'{{"id":"chatcmpl-{n}","object":"chat.completion","created":{int(time.time())},'
            f'"model":{_dumps(model if isinstance(model, str) else "replay")},'
        )
        want_ids = self.token_ids and body.get("return_token_ids") is True
        if fault in MESSAGE_FAULTS:
            tail = fault_tail(rec, fault, attempt, want_ids, _max_tokens(body))
        else:
            tail = rec.tail_ids if want_ids else rec.tail
        raw = (head + tail + "}").encode()
        if fault == "truncated":
            raw = raw[: len(raw) // 2]
        return self._answer(200, raw, headers, fault)

    async def models(self, request: Request) -> Response:
        return Response(
            b'{"object":"list","data":[{"id":"replay","object":"model"}]}',
            media_type="application/json",
        )

    async def health(self, request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def stats(self, request: Request) -> Response:
        return Response(_dumps(self.stats_dict()).encode(), media_type="application/json")

    def stats_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_status": dict(sorted(self.by_status.items())),
            "faults": dict(self.fault_counts),
            "attempts": sum(self.attempts.values()),
            "hung_up": self.hung_up,
            "records": self.loaded,
            "skipped": dict(self.skipped),
        }


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    kind = "not_found" if status == 404 else "invalid_request_error"
    return Response(
        _error_body(f"{detail}: {request.method} {request.url.path}", kind),
        status_code=status,
        media_type="application/json",
    )


def make_app(
    records: Iterable[Mapping[str, Any] | ReplayRecord],
    faults: str | Mapping[str, float] | None = None,
    seed: int = 0,
    token_ids: bool = False,
    slow_seconds: float = 5.0,
    *,
    skipped: Mapping[str, int] | None = None,
) -> Starlette:
    """The replay server as an ASGI app. ``faults`` is a spec string (see ``parse_faults``) or
    its parsed form; ``skipped`` (from ``load_records``) is only reported by ``/stats``.
    The app's counters are at ``app.state.replay``."""
    if isinstance(faults, Mapping):  # a parsed mapping is checked exactly like a spec
        faults = ",".join(f"{k}={v!r}" for k, v in faults.items())
    rates = parse_faults(faults)
    if not (slow_seconds >= 0 and math.isfinite(slow_seconds)):
        raise InputError(f"--slow-seconds {slow_seconds}: give a finite number of seconds >= 0")
    state = _Replay(records, rates, seed, token_ids, slow_seconds, skipped or {})
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", state.chat, methods=["POST"]),
            Route("/v1/models", state.models, methods=["GET"]),
            Route("/health", state.health, methods=["GET"]),
            Route("/stats", state.stats, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
    )
    app.state.replay = state
    return app


def _summary(app: Starlette, source: str) -> str:
    st: _Replay = app.state.replay
    skipped = sum(st.skipped.values())
    why = ", ".join(f"{k} {v}" for k, v in sorted(st.skipped.items()))
    faults = ",".join(f"{k}={v:g}" for k, v in st.faults.items()) or "none"
    return (
        f"replay-server: {st.loaded} records from {source}; skipped {skipped}"
        + (f" ({why})" if why else "")
        + f"; faults {faults}; seed {st.seed}; token ids {'on' if st.token_ids else 'off'}"
    )


def serve(
    records_path: Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    faults: str | None = None,
    seed: int = 0,
    token_ids: bool = False,
    slow_seconds: float = 5.0,
) -> None:
    """Load ``records_path`` and serve it until interrupted (blocking)."""
    records, skipped = load_records(records_path)
    app = make_app(records, faults, seed, token_ids, slow_seconds, skipped=skipped)
    sock = _bind(host, port)
    print(_summary(app, str(records_path)), file=sys.stderr, flush=True)
    print(f"replay-server: listening on {_base_url(sock)}/v1", file=sys.stderr, flush=True)
    config = _uvicorn_config(app)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def _uvicorn_config(app: Starlette) -> uvicorn.Config:
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    hide_injected_cuts()  # after Config, which configures uvicorn's logging
    return config


def _bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on (host, port), or InputError naming the fix."""
    if not 0 <= port <= 65535:  # the resolver would take it modulo 65536, or call it a host error
        raise InputError(
            f"--port {port}: not a TCP port; give one from 1 to 65535 (0 picks a free one)"
        )
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise InputError(f"--host {host!r}: cannot resolve ({e}); give an address") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise InputError(
            f"--host {host} --port {port}: cannot listen ({e.strerror}); pick another port"
        ) from e
    return sock


def _base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.contextmanager
def serve_in_thread(app: Starlette, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Run ``app`` under uvicorn in a daemon thread; yields its base URL (``http://host:port``).
    Port 0 picks a free port. Stops the server on exit."""
    sock = _bind(host, port)
    base = _base_url(sock)
    config = _uvicorn_config(app)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise DraftdataError(f"replay server on {base} did not start; see the log above")
        time.sleep(0.01)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)
        sock.close()
