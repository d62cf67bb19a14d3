"""A chat-completions server of the tests' own that lies: raw asyncio on loopback, no draftdata
code. It answers every request in a shape the test names (absurd values that are still valid
JSON, bodies too large or without a length, usage that under-reports), counts what it served,
and counts the answer tokens it really sent with HF's `tokenizers` (not draftdata's), so what
the run spent can be recounted independently of what the run charged.

Prompts carry their index as a ``[N]`` prefix of the user message; a shape applies to the
prompts whose index is in ``hit`` (all of them by default)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from conftest import TOKENIZERS

_INDEX = re.compile(r"^\[(\d+)\]")
TOKENIZER = Tokenizer.from_file(str(TOKENIZERS / "smollm2" / "tokenizer.json"))
#: the text of a normal answer: about 40 SmolLM2 tokens
ANSWER = (
    "Here is a short answer. The capital of France is Paris, and the river that runs through "
    "it is the Seine. I hope this helps with your question."
)


def tokens(text: str) -> int:
    return len(TOKENIZER.encode(text, add_special_tokens=False).ids)


@dataclass
class Served:
    #: completion requests (POST); ``gets``: what the client asked about the server (its models)
    requests: int = 0
    gets: int = 0
    answers: int = 0
    #: completion tokens of every answer sent, by HF's own count of the content
    answer_tokens: int = 0
    #: requests held (``hold``), not answered yet
    held: int = 0
    by_shape: dict[str, int] = field(default_factory=dict)


#: a shape: (request body, index of the prompt, answers sent so far) -> what to send. A dict
#: is sent as JSON with a Content-Length; bytes as they are with a Content-Length; a
#: ``Stream`` without one (to the close)
Shape = Callable[[dict[str, Any], int, int], "dict[str, Any] | bytes | Stream | Events | Refusal"]


@dataclass(frozen=True)
class Stream:
    """A body with no Content-Length: ``head`` then ``chunk`` repeated to ``total`` bytes, then
    the connection is closed (or the client hangs up first)."""

    head: bytes
    chunk: bytes
    total: int


@dataclass(frozen=True)
class Refusal:
    """An HTTP error: ``status`` and ``body`` (JSON) as they are."""

    status: int
    body: bytes


@dataclass(frozen=True)
class Events:
    """Server-sent events with no end: ``event(k)`` for k = 0, 1, ... until ``total`` bytes of
    them are written or the client hangs up (what a field the client does not count grows)."""

    event: Callable[[int], dict[str, Any]]
    total: int


def completion(
    content: Any,
    *,
    finish: Any = "stop",
    usage: dict[str, Any] | None = None,
    extra_choice: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}}
    choice["finish_reason"] = finish
    choice.update(extra_choice or {})
    body: dict[str, Any] = {"id": "x", "object": "chat.completion", "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    body.update(extra or {})
    return body


def honest(content: str = ANSWER, prompt_tokens: int = 30) -> dict[str, Any]:
    n = tokens(content)
    return completion(
        content, usage={"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": n}
    )


async def _end(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until they are done."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Hostile:
    """``token_s``: the time a token takes to decode. A whole answer is sent after all its
    tokens' time; a request asking ``stream: true`` is answered as server-sent events, one per
    token of the content (HF's tokens), ``token_s`` apart. A streamed token counts as served
    once written, and the answer stops at the first write that finds the client gone (what a
    server bills for a stream it was hung up on)."""

    def __init__(
        self,
        shape: Shape,
        hit: Callable[[int], bool] = lambda i: True,
        token_s: float = 0.0,
        *,
        whole_only: bool = False,
        rechunk: int = 0,
        details: str = "",
    ) -> None:
        """``whole_only``: ``stream: true`` is ignored (every answer is sent whole);
        ``rechunk``: a proxy between: the stream's bytes go out in HTTP chunks of this size,
        whatever the events' edges; ``details``: the reasoning is streamed as OpenRouter's
        ``reasoning_details`` entries, beside the same ``reasoning`` text ("both", as
        OpenRouter does) or alone ("only")."""
        self.shape = shape
        self.hit = hit
        self.token_s = token_s
        self.whole_only = whole_only
        self.rechunk = rechunk
        self.details = details
        self.served = Served()
        self.hold = threading.Event()  # set: requests are held until it is cleared
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    # -- the protocol -------------------------------------------------------------------------
    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await r.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                raw = await r.readexactly(length)
                if not head.startswith(b"POST "):  # GET /v1/models: a list naming no engine
                    self.served.gets += 1
                    body = b'{"object":"list","data":[{"id":"hostile","object":"model"}]}'
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                    await w.drain()
                    continue
                self.served.requests += 1
                if not await self._answer(json.loads(raw), w):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # cancelled: the server is stopping (``running``)
        finally:
            w.close()

    async def _answer(self, req: dict[str, Any], w: asyncio.StreamWriter) -> bool:
        """Answers one request; False when the connection is to close after it."""
        if self.hold.is_set():
            self.served.held += 1
            while self.hold.is_set():
                await asyncio.sleep(0.02)
            self.served.held -= 1
        user = next(m["content"] for m in req["messages"] if m["role"] == "user")
        m = _INDEX.match(user)
        index = int(m.group(1)) if m else 0
        out: dict[str, Any] | bytes | Stream | Events | Refusal
        if self.hit(index):
            out = self.shape(req, index, self.served.answers)
            self.served.by_shape["hit"] = self.served.by_shape.get("hit", 0) + 1
        else:
            out = honest()
        self.served.answers += 1
        if isinstance(out, Events):
            return await self._endless(out, w)
        if isinstance(out, Refusal):
            w.write(
                b"HTTP/1.1 %d Refused\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % (out.status, len(out.body)) + out.body
            )
            await w.drain()
            return True
        if isinstance(out, dict) and req.get("stream") is True and not self.whole_only:
            return await self._events(out, req, w)
        if isinstance(out, dict):
            n = self._count(out)  # billed: decoded whether or not the client waits for it
            if self.token_s:  # decoded before a byte of a whole answer is sent
                await asyncio.sleep(self.token_s * n)
            body = json.dumps(out).encode()  # NaN stays NaN: Python writes it, as some servers do
        elif isinstance(out, bytes):
            body = out
        else:
            w.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
            )
            w.write(out.head)
            sent = len(out.head)
            while sent < out.total:
                w.write(out.chunk)
                sent += len(out.chunk)
                await w.drain()
            return False
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body)
            + body
        )
        await w.drain()
        return True

    async def _events(
        self, out: dict[str, Any], req: dict[str, Any], w: asyncio.StreamWriter
    ) -> bool:
        """``out`` streamed: a role event, one event per token of its reasoning and content,
        its tool calls (a call's id, type and name, then its arguments 7 characters at a
        time), the finish, its usage where the request asked for it, [DONE]; each event one
        HTTP chunk. Every event counts as a token served."""
        choice = out["choices"][0]
        msg = choice["message"]
        deltas: list[dict[str, Any]] = []  # the reasoning, then the content, a token each
        for key in ("reasoning", "content"):
            text = msg.get(key) or ""
            pos = 0  # a character split over tokens goes with the first of them
            for _, b in TOKENIZER.encode(text, add_special_tokens=False).offsets:
                piece = text[pos : max(pos, b)]
                d: dict[str, Any] = {key: piece}
                if key == "reasoning" and self.details:  # OpenRouter's shape
                    entry = {"type": "reasoning.text", "text": piece, "format": "x", "index": 0}
                    d = {"reasoning_details": [entry]}
                    if self.details == "both":
                        d[key] = piece
                deltas.append(d)
                pos = max(pos, b)
        for i, call in enumerate(msg.get("tool_calls") or []):  # as OpenAI streams a call
            fn = call["function"]
            head = {"index": i, "id": call["id"], "type": "function"}
            deltas.append(
                {"tool_calls": [{**head, "function": {"name": fn["name"], "arguments": ""}}]}
            )
            args = fn["arguments"]
            deltas += [
                {"tool_calls": [{"index": i, "function": {"arguments": args[k : k + 7]}}]}
                for k in range(0, len(args), 7)
            ]

        pending = bytearray()  # what a re-chunking proxy holds until it has a chunk's worth

        def chunk(event: dict[str, Any] | str) -> bytes:
            data = b"data: " + (json.dumps(event) if isinstance(event, dict) else event).encode()
            if not self.rechunk:
                return b"%x\r\n%s\n\n\r\n" % (len(data) + 2, data)
            pending.extend(data + b"\n\n")
            out = b""
            while len(pending) >= self.rechunk:
                out += b"%x\r\n%s\r\n" % (self.rechunk, bytes(pending[: self.rechunk]))
                del pending[: self.rechunk]
            return out

        def flush() -> bytes:
            out = b"%x\r\n%s\r\n" % (len(pending), bytes(pending)) if pending else b""
            pending.clear()
            return out

        def delta(d: dict[str, Any], finish: Any = None) -> dict[str, Any]:
            ch = {"index": 0, "delta": d, "finish_reason": finish}
            return {"id": "x", "object": "chat.completion.chunk", "choices": [ch]}

        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunk(delta({"role": "assistant"}))
        )
        try:
            await w.drain()
            for d in deltas:
                if self.token_s:
                    await asyncio.sleep(self.token_s)
                w.write(chunk(delta(d)))
                await w.drain()
                if w.is_closing():
                    return False
                self.served.answer_tokens += 1
            tail = chunk(delta({}, choice.get("finish_reason", "stop")))
            if out.get("usage") is not None and (req.get("stream_options") or {}).get(
                "include_usage"
            ):
                tail += chunk({"id": "x", "choices": [], "usage": out["usage"]})
            w.write(tail + chunk("[DONE]") + flush() + b"0\r\n\r\n")
            await w.drain()
        except ConnectionError:
            return False
        return True

    async def _endless(self, out: Events, w: asyncio.StreamWriter) -> bool:
        """``out``'s events, each one HTTP chunk, until its bytes are written or the client
        has gone."""
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        sent, k = 0, 0
        try:
            while sent < out.total:
                data = b"data: " + json.dumps(out.event(k)).encode() + b"\n\n"
                w.write(b"%x\r\n%s\r\n" % (len(data), data))
                sent += len(data)
                k += 1
                if k % 64 == 0:
                    await w.drain()
                    if w.is_closing():
                        return False
            w.write(b"0\r\n\r\n")
            await w.drain()
        except ConnectionError:
            pass
        return False

    def _count(self, out: dict[str, Any]) -> int:
        try:
            content = out["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return 0
        n = tokens(content) if isinstance(content, str) else 0
        self.served.answer_tokens += n
        return n

    # -- running --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(
                asyncio.start_server(self._conn, "127.0.0.1", 0, limit=1 << 20)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            self._server.close()
            # the connections still open (keep-alive, or held) end here, not in a finaliser
            # later: a task destroyed pending logs from whatever thread collects it
            loop.run_until_complete(_end(asyncio.all_tasks(loop)))
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        ready.wait()
        try:
            yield f"http://127.0.0.1:{self.port}/v1"
        finally:
            self.hold.clear()
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._loop.stop)
            t.join(timeout=30)
