"""One streamed answer (``stream: true``) as it arrives: put back together by
``records.stream.StreamAssembly``, and hung up on the moment it passes the runaway limit or the
answer's byte cap, so a server that ignores ``max_tokens`` is paid for about the limit, not
for all it would have written.

The answer's tokens are counted as they come: the ids, where the server sends them (vLLM's
``return_token_ids``); otherwise its text in the target's tokens, each new piece counted once
(the whole answer is encoded about once): a piece is counted when it has as many characters as
tokens are left to the limit, since a token is at least a character (a rare CJK character can
be two or three tokens). Pieces counted apart can count a token more at each seam than the
whole: that errs toward hanging up, and an honest answer stays at least 0.5 x max_tokens + 32
tokens under the limit."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from ...records.stream import StreamAssembly
from .http11 import Feed

#: counts a text in the target's tokens
Counter = Callable[[str], int]


class StreamWatch:
    """The Sink (``http11.Sink``) for one streamed attempt, and what it saw."""

    def __init__(self, limit_tokens: float, max_bytes: int, count: Counter) -> None:
        self.limit_tokens = limit_tokens
        self.max_bytes = max_bytes
        self.count = count
        self.asm = StreamAssembly(max_event_bytes=max_bytes)
        self.raw_bytes = 0
        #: the answer's tokens at the last count (ids, or text counted)
        self.tokens = 0
        #: why the client hung up: "runaway" or "oversized" (None: it read to the end)
        self.stopped: str | None = None
        self._counted_chars = 0

    def sink(self, headers: Mapping[str, str]) -> Feed | None:
        """Takes a body sent as events; anything else (a server that answers whole) is read
        whole, as it would be without streaming."""
        if "text/event-stream" in headers.get("content-type", "").lower():
            return self.feed
        return None

    def feed(self, data: bytes) -> bool:
        self.raw_bytes += len(data)
        if self.asm.done:
            return False  # what follows [DONE] (the chunked body's end) is read, not kept
        self.asm.feed(data)
        if self.asm.problem is not None:
            return True  # unusable whatever follows: stop paying for it
        if self.asm.ids:
            self.tokens = self.asm.ids
        elif self.asm.chars - self._counted_chars >= max(1.0, self.limit_tokens - self.tokens):
            self.tokens += self.count(self.asm.take_fresh())
            self._counted_chars = self.asm.chars
        if self.tokens > self.limit_tokens:
            self.stopped = "runaway"
        elif self.asm.held > self.max_bytes:
            self.stopped = "oversized"
        return self.stopped is not None

    def written(self) -> int:
        """The answer's tokens so far: the ids, or its text counted, what came since the last
        count included (what a stream hung up on, or timed out, was billed for at least)."""
        if self.asm.ids:
            return self.asm.ids
        if self.asm.chars > self._counted_chars:
            self.tokens += self.count(self.asm.take_fresh())
            self._counted_chars = self.asm.chars
        return self.tokens

    def ended(self) -> str | None:
        """The stream has ended (or was hung up on): None where the answer can be read, or the
        reason to ask again (an ``error`` event, a stream cut before its end)."""
        self.asm.finish(hung_up=self.stopped is not None)
        if self.asm.error is not None:
            return "stream_error"
        if self.stopped is not None or self.asm.problem is not None or self.asm.done:
            return None
        body = self.asm.body()
        if any(ch.get("finish_reason") is not None for ch in body["choices"]):
            return None  # no [DONE], but the answer says it is finished
        return "connection_error:stream_cut"

    def text(self) -> str:
        """The answer put back together, as the text the ledger keeps of it."""
        body = self.asm.body()
        if self.stopped is not None:
            body["stream_stopped"] = self.stopped
        try:
            out = json.dumps(body, ensure_ascii=False)
            out.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate a server escaped: kept escaped
            out = json.dumps(body)
        return out
