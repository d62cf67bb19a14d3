"""A lean HTTP/1.1 client for the generation hot path: one POST endpoint, kept-alive connections,
one write per request, bodies by Content-Length, chunked or read to the close.

On a local server (vLLM, SGLang, transformers serve) answering hundreds of requests a second the
client's own CPU is the limit: aiohttp's request path cost about a third of `generate`'s time
there. This client does only what the chat endpoint needs. What it does not do is said here:
no redirects (a 3xx is a failed attempt with its status, like any non-200), no proxies (aiohttp
was run without them too), no cookies. Servers are asked for identity encoding; a gzip or
deflate body sent anyway is decompressed. `https://` URLs use aiohttp unless the backend asks
for this client (`http = "lean"`).

A connection the server closed while it sat idle fails at once on reuse, before any byte of an
answer: the request is sent again on a fresh connection, without counting as an attempt. Any
other failure is a ``TransportError`` whose ``reason`` names it (`body_cut`, `disconnected`,
`reset`, `refused`, `bad_response`, `os_error`)."""

from __future__ import annotations

import asyncio
import base64
import ssl
import sys
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ...version import __version__

#: the most header bytes a response may have
HEAD_LIMIT = 1 << 20
#: the most body bytes read of one response unless the caller says otherwise
DEFAULT_MAX_BODY = 64 << 20
#: bytes read at a time from a body of unknown length
READ_STEP = 1 << 16


#: a body's reader, fed its bytes as they arrive: True hangs up (the rest is not read)
Feed = Callable[[bytes], bool]
#: given a 200 answer's headers, the Feed its body goes to (then the Reply's body is empty), or
#: None to read the body whole (a streamed answer is read as it comes: ``stream: true``)
Sink = Callable[[Mapping[str, str]], Feed | None]


class TransportError(Exception):
    def __init__(self, reason: str, detail: str = "", *, sent: bool = True) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        #: the request may have reached the server (False: the connection never opened)
        self.sent = sent


class _Stale(Exception):
    """The server closed a kept connection before answering on it."""


@dataclass(frozen=True)
class Reply:
    status: int
    #: header names lower-cased; a repeated header's values joined with ", "
    headers: dict[str, str]
    body: bytes
    #: the body ran past the client's limit: ``body`` is its first ``limit`` bytes, the rest
    #: was not read (the connection is closed)
    cut: bool = False
    #: the body went to a Sink's Feed, not into ``body``; ``stopped``: the Feed hung up
    fed: bool = False
    stopped: bool = False


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class LeanHttp:
    """POSTs to one URL. ``headers`` go on every request (an Authorization header, say)."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        timeout_s: float,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        u = urlsplit(url)
        self.max_body = max_body
        self.tls = u.scheme == "https"
        self.host = u.hostname or ""
        self.port = u.port or (443 if self.tls else 80)
        self.timeout_s = timeout_s
        self.ssl = ssl.create_default_context() if self.tls else None
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        host = self.host if u.port is None else f"{self.host}:{u.port}"
        if ":" in self.host:  # an IPv6 literal goes in brackets
            host = f"[{self.host}]" + (f":{u.port}" if u.port else "")
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: {host}",
            "Content-Type: application/json",
            "Accept: application/json",
            "Accept-Encoding: identity",
            f"User-Agent: draftdata/{__version__}",
        ]
        if u.username is not None:  # credentials in the URL: basic auth, as aiohttp sends them
            pair = f"{unquote(u.username)}:{unquote(u.password or '')}"
            lines.append("Authorization: Basic " + base64.b64encode(pair.encode()).decode())
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._idle: list[_Conn] = []

    async def post(self, body: bytes, sink: Sink | None = None) -> Reply:
        """One request and its whole answer, within ``timeout_s`` (TimeoutError past it). A
        ``sink`` may take a 200 answer's body as it arrives (an identity-encoded one)."""
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(self.timeout_s):
                return await self._post(body, sink)
        return await asyncio.wait_for(self._post(body, sink), self.timeout_s)  # pragma: no cover

    async def _post(self, body: bytes, sink: Sink | None) -> Reply:
        while True:
            while self._idle and self._idle[-1].reader.at_eof():
                self._idle.pop().close()  # closed by the server while it sat idle
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._open()
            try:
                reply, keep = await self._exchange(conn, body, reused, sink)
            except _Stale:
                conn.close()
                continue  # only a reused connection is stale: the next try opens one
            except BaseException:
                conn.close()
                raise
            if keep:
                self._idle.append(conn)
            else:
                conn.close()
            return reply

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    async def _open(self) -> _Conn:
        try:
            r, w = await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self.ssl,
                server_hostname=self.host if self.tls else None,
                limit=HEAD_LIMIT,
            )
        except ConnectionRefusedError as e:
            raise TransportError("refused", str(e), sent=False) from e
        except (ssl.SSLError, OSError) as e:
            raise TransportError("os_error", str(e), sent=False) from e
        return _Conn(r, w)

    async def _exchange(
        self, conn: _Conn, body: bytes, reused: bool, sink: Sink | None
    ) -> tuple[Reply, bool]:
        r, w = conn.reader, conn.writer
        answered = False
        feed: Feed | None = None
        try:
            w.write(self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await w.drain()
            while True:  # 1xx answers (100 Continue) come before the real one
                try:
                    head = await r.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as e:
                    if reused and not e.partial:
                        raise _Stale from e
                    raise TransportError("disconnected", "no answer before the close") from e
                answered = True
                status, version, headers = _head(head)
                if not 100 <= status < 200:
                    break
            plain = headers.get("content-encoding", "identity").lower() == "identity"
            if sink is not None and status == 200 and plain:
                feed = sink(headers)
            payload, to_close, cut = await _body(r, status, headers, self.max_body, feed)
        except (ConnectionResetError, BrokenPipeError) as e:
            if reused and not answered:
                raise _Stale from e
            raise TransportError("reset", str(e)) from e
        except asyncio.LimitOverrunError as e:
            raise TransportError("bad_response", f"headers over {HEAD_LIMIT} bytes") from e
        except ssl.SSLError as e:
            raise TransportError("os_error", str(e)) from e
        conn_hdr = headers.get("connection", "").lower()
        keep = not to_close and (
            "keep-alive" in conn_hdr if version == "HTTP/1.0" else "close" not in conn_hdr
        )
        if feed is not None:
            return Reply(status, headers, b"", fed=True, stopped=cut), keep and not cut
        body, cut_decoded = _decoded(payload, headers, self.max_body)
        return Reply(status, headers, body, cut or cut_decoded), keep and not cut


def _head(head: bytes) -> tuple[int, str, dict[str, str]]:
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise TransportError("bad_response", f"status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise TransportError("bad_response", f"header line {line[:80]!r}")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return int(parts[1]), parts[0], headers


async def _body(
    r: asyncio.StreamReader,
    status: int,
    headers: Mapping[str, str],
    limit: int,
    feed: Feed | None = None,
) -> tuple[bytes, bool, bool]:
    """The body (at most ``limit`` bytes: counted while reading, so a body that runs on never
    sits in memory whole), whether the connection ends with it, and whether it was cut at the
    limit (then the rest is left unread and the connection is closed). With a ``feed``, the
    body goes to it piece by piece instead (no limit: the feed keeps its own), and "cut" is
    the feed hanging up."""
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await (_chunks(r, limit) if feed is None else _fed_chunks(r, feed))
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise TransportError("bad_response", f"Content-Length {length[:40]!r}")
            n = int(length)
            if feed is not None:  # what has arrived, as it arrives
                while n > 0:
                    got = await r.read(min(n, READ_STEP))
                    if not got:
                        raise TransportError("body_cut", f"{n} bytes of the body did not arrive")
                    n -= len(got)
                    if feed(got):
                        return b"", True, True
                return b"", False, False
            if n > limit:  # announced too long: read what the limit allows, then hang up
                return await r.readexactly(limit), True, True
            return await r.readexactly(n), False, False
        if status in (204, 304):
            return b"", False, False
        if feed is not None:
            while got := await r.read(READ_STEP):
                if feed(got):
                    return b"", True, True
            return b"", True, False
        out = bytearray()  # neither: the body runs to the close
        while len(out) <= limit:
            got = await r.read(READ_STEP)
            if not got:
                return bytes(out), True, False
            out += got
        return bytes(out[:limit]), True, True
    except asyncio.IncompleteReadError as e:
        raise TransportError(
            "body_cut", f"{len(e.partial)} of {e.expected or '?'} bytes arrived"
        ) from e


async def _chunk_size(r: asyncio.StreamReader) -> int:
    """The next chunk's size; at the last chunk (0), its trailers and blank line are read too."""
    line = await r.readuntil(b"\r\n")
    size_hex = line.split(b";", 1)[0].strip()
    try:
        size = int(size_hex, 16)
    except ValueError:
        raise TransportError("bad_response", f"chunk size {size_hex[:20]!r}") from None
    if size == 0:
        while await r.readuntil(b"\r\n") != b"\r\n":  # trailers, then the blank line
            pass
    return size


async def _chunks(r: asyncio.StreamReader, limit: int) -> tuple[bytes, bool, bool]:
    out = bytearray()
    while True:
        size = await _chunk_size(r)
        if size == 0:
            return bytes(out), False, False
        if len(out) + size > limit:
            out += await r.readexactly(limit - len(out))
            return bytes(out), True, True
        out += await r.readexactly(size)
        if await r.readexactly(2) != b"\r\n":
            raise TransportError("bad_response", "a chunk not followed by CRLF")


async def _fed_chunks(r: asyncio.StreamReader, feed: Feed) -> tuple[bytes, bool, bool]:
    """A chunked body given to ``feed`` chunk by chunk (a streamed answer: one event or a few
    per chunk); a chunk larger than READ_STEP in pieces."""
    while True:
        size = await _chunk_size(r)
        if size == 0:
            return b"", False, False
        while size > 0:
            got = await r.read(min(size, READ_STEP))
            if not got:
                raise asyncio.IncompleteReadError(b"", size)
            size -= len(got)
            if feed(got):
                return b"", True, True
        if await r.readexactly(2) != b"\r\n":
            raise TransportError("bad_response", "a chunk not followed by CRLF")


def _decoded(body: bytes, headers: Mapping[str, str], limit: int) -> tuple[bytes, bool]:
    """The body decompressed (to at most ``limit`` bytes), and whether it was cut there."""
    enc = headers.get("content-encoding", "identity").lower()
    if enc not in ("gzip", "deflate"):
        return body, False
    wbits = [16 + zlib.MAX_WBITS] if enc == "gzip" else [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    failed: zlib.error | None = None
    for w in wbits:  # deflate: zlib-wrapped, or raw as some send it
        try:
            d = zlib.decompressobj(w)
            out = d.decompress(body, limit)
            cut = bool(d.unconsumed_tail)
            # a gzip body may be several members one after another (RFC 1952), read as one
            # (zero bytes after the last are padding, as the gzip module takes them)
            while enc == "gzip" and not cut and d.eof and d.unused_data.strip(b"\0"):
                rest, room = d.unused_data, limit - len(out)
                if room <= 0:  # (0 would mean no limit to zlib)
                    cut = True
                    break
                d = zlib.decompressobj(w)
                out += d.decompress(rest, room)
                cut = bool(d.unconsumed_tail)
            return out, cut
        except zlib.error as e:
            failed = e
    raise TransportError("bad_response", f"a {enc} body that does not decompress") from failed
