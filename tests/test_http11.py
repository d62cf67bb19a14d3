"""The lean HTTP/1.1 client against servers this project did not write: aiohttp's web server
(chunked and compressed bodies, closes, a kept connection it drops while idle) and the standard
library's http.server (HTTP/1.0, a body that runs to the close). Each answer is compared with
what aiohttp's own client gets from the same server."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from draftdata.generate.backends.http11 import LeanHttp, TransportError
from shared import ANSWER, BODY, RELEASE, aiohttp_get, with_app


def test_chunked_and_gzip_bodies_come_back_as_aiohttp_reads_them():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200)
        resp.enable_chunked_encoding()
        resp.enable_compression(web.ContentCoding.gzip)
        await resp.prepare(request)
        for i in range(0, len(ANSWER), 997):  # many chunks
            await resp.write(ANSWER[i : i + 997])
        await resp.write_eof()
        return resp

    async def fn(url: str, seen: dict[str, Any]) -> None:
        lean = LeanHttp(url, headers={}, timeout_s=10)
        got = [await lean.post(BODY) for _ in range(3)]
        await lean.aclose()
        ref = await aiohttp_get(url)
        assert all(g.status == ref[0] == 200 and g.body == ref[1] == ANSWER for g in got)
        assert got[0].headers["content-encoding"] == "gzip"

    seen = asyncio.run(with_app(handler, fn))
    assert seen["bodies"][:3] == [BODY] * 3
    assert len(seen["peers"]) == 2  # the lean client's three requests on one connection


def test_connection_close_and_an_idle_connection_the_server_dropped():
    """A response with Connection: close is not reused; a kept connection the server closes
    while idle is replaced without a failure and without sending the request twice."""

    async def handler(request: web.Request) -> web.StreamResponse:
        close = request.headers.get("X-Close") == "1"
        return web.Response(body=ANSWER, headers={"Connection": "close"} if close else {})

    async def fn(url: str, seen: dict[str, Any]) -> None:
        lean = LeanHttp(url, headers={}, timeout_s=10)
        assert (await lean.post(BODY)).body == ANSWER
        kept = lean._idle[0]
        while not kept.reader.at_eof():  # past its keep-alive the server closes the connection
            await asyncio.sleep(0.02)
        assert (await lean.post(BODY)).body == ANSWER
        assert kept not in lean._idle
        await lean.aclose()
        closing = LeanHttp(url, headers={"X-Close": "1"}, timeout_s=10)
        for _ in range(2):
            assert (await closing.post(BODY)).body == ANSWER
        assert not closing._idle
        await closing.aclose()

    seen = asyncio.run(with_app(handler, fn, keepalive_timeout=0.1))
    assert seen["requests"] == 4  # nothing was sent twice
    assert len(seen["peers"]) == 4


def test_a_cut_body_a_slow_server_and_url_credentials():
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers.get("X-Mode") == "slow":
            await request.app[RELEASE].wait()  # held until the client has timed out
        resp = web.StreamResponse(status=200, headers={"Content-Length": str(len(ANSWER))})
        await resp.prepare(request)
        await resp.write(ANSWER[:1000])
        request.transport.close()  # type: ignore[union-attr]
        return resp

    async def fn(url: str, seen: dict[str, Any]) -> None:
        lean = LeanHttp(url.replace("http://", "http://al%40ice:p%3Ass@"), headers={}, timeout_s=10)
        with pytest.raises(TransportError) as e:
            await lean.post(BODY)
        assert e.value.reason == "body_cut" and "1000 of" in str(e.value)
        slow = LeanHttp(url, headers={"X-Mode": "slow"}, timeout_s=0.3)
        with pytest.raises(TimeoutError):
            await slow.post(BODY)
        seen["release"].set()

    seen = asyncio.run(with_app(handler, fn))
    import base64

    assert seen["auth"][0] == "Basic " + base64.b64encode(b"al@ice:p:ss").decode()


def test_http_1_0_body_read_to_the_close_from_the_standard_library_server():
    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            n = int(self.headers["Content-Length"])
            got = self.rfile.read(n)
            self.send_response(200 if got == BODY else 400)
            self.send_header("Set-Cookie", "a=1")
            self.send_header("Set-Cookie", "b=2")
            self.end_headers()  # no Content-Length: the body runs to the close
            self.wfile.write(ANSWER)

        def log_message(self, *_: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1/chat/completions"

    async def go() -> None:
        lean = LeanHttp(url, headers={}, timeout_s=10)
        for _ in range(2):
            r = await lean.post(BODY)
            assert (r.status, r.body) == (200, ANSWER) == await aiohttp_get(url)
            assert r.headers["set-cookie"] == "a=1, b=2"
        assert not lean._idle  # HTTP/1.0 without keep-alive: never reused

    try:
        asyncio.run(go())
    finally:
        srv.shutdown()


EVENTS = b"".join(b"data: %d\n\n" % i for i in range(400))


def _collect(into: bytearray, stop_after: int | None = None) -> Any:
    """A sink that keeps what it is fed in ``into``, and hangs up past ``stop_after`` bytes."""

    def sink(headers: Any) -> Callable[[bytes], bool]:
        assert headers["content-type"] == "text/event-stream"

        def feed(b: bytes) -> bool:
            into.extend(b)
            return stop_after is not None and len(into) > stop_after

        return feed

    return sink


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
def test_a_sink_takes_a_stream_as_it_comes_and_hangs_up_when_told(framing):
    """A streamed body (aiohttp's server: chunked, with a Content-Length, or to the close)
    goes to the sink's feed piece by piece, whole and in order, and a feed that says stop
    ends the request at once, its connection closed, for the lean client and aiohttp's."""
    from draftdata.generate.backends.aio import AiohttpClient

    async def handler(request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream"}
        if framing == "length":
            headers["Content-Length"] = str(len(EVENTS))
        if framing == "close":
            headers["Connection"] = "close"
        resp = web.StreamResponse(status=200, headers=headers)
        if framing == "chunked":
            resp.enable_chunked_encoding()
        elif framing == "close":
            resp.force_close()
        await resp.prepare(request)
        for i in range(0, len(EVENTS), 101):
            await resp.write(EVENTS[i : i + 101])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    async def fn(url: str, seen: dict[str, Any]) -> None:
        for client in (
            LeanHttp(url, headers={}, timeout_s=10),
            AiohttpClient(url, {}, 10, 2, 1 << 20),
        ):
            taken = bytearray()
            got = await client.post(BODY, _collect(taken))
            assert got.fed and not got.stopped and got.body == b"" and bytes(taken) == EVENTS
            upto = bytearray()
            got = await client.post(BODY, _collect(upto, stop_after=500))
            assert got.stopped and 500 < len(upto) < len(EVENTS)
            assert EVENTS.startswith(bytes(upto))
            plain = await client.post(BODY, lambda h: None)  # a sink that declines: read whole
            assert not plain.fed and plain.body == EVENTS
            await client.aclose()

    asyncio.run(with_app(handler, fn))
