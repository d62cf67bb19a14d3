"""What a hostile server can send the two HTTP clients (issue 37): a redirect to another origin is
a failed attempt with its status, never followed (the reply to a request we did not send is
never stored as an answer), and a gzip body of several members is read whole, within the byte
cap, as aiohttp reads it. Each case failed before the change it guards."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

from aiohttp import web

from draftdata.generate.backends.aio import AiohttpClient
from draftdata.generate.backends.http11 import LeanHttp
from shared import ANSWER, BODY, aiohttp_get, with_app


def test_a_redirect_to_another_origin_is_not_followed():
    """Server A answers 301 to server B (another port: another origin), which would answer
    anything: A's 301 is what comes back, and B never hears from either client."""
    reached: list[str] = []

    async def other(request: web.Request) -> web.StreamResponse:
        reached.append(f"{request.method} {request.path} {request.headers.get('Authorization')}")
        return web.Response(body=ANSWER)

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", other)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        b_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        async def redirect(request: web.Request) -> web.StreamResponse:
            raise web.HTTPMovedPermanently(f"http://127.0.0.1:{b_port}/v1/chat/completions")

        async def fn(a_url: str, seen: dict[str, Any]) -> None:
            for client in (
                AiohttpClient(a_url, {"Authorization": "Bearer k"}, 10, 2, 1 << 20),
                LeanHttp(a_url, headers={"Authorization": "Bearer k"}, timeout_s=10),
            ):
                got = await client.post(BODY)
                await client.aclose()
                assert got.status == 301 and got.body != ANSWER

        try:
            await with_app(redirect, fn)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert reached == []


def test_a_gzip_body_of_several_members_is_read_whole():
    parts = [ANSWER[:5000], ANSWER[5000:9000], ANSWER[9000:]]
    body = b"".join(gzip.compress(p) for p in parts)

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, headers={"Content-Encoding": "gzip"})

    async def fn(url: str, seen: dict[str, Any]) -> None:
        lean = LeanHttp(url, headers={}, timeout_s=10)
        got = await lean.post(BODY)
        await lean.aclose()
        ref = await aiohttp_get(url)
        assert ref == (200, ANSWER)
        assert (got.status, got.body, got.cut) == (200, ANSWER, False)
        capped = LeanHttp(url, headers={}, timeout_s=10, max_body=7000)
        got = await capped.post(BODY)
        await capped.aclose()
        assert got.cut and got.body == ANSWER[:7000]

    asyncio.run(with_app(handler, fn))
