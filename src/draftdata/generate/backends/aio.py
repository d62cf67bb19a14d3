"""aiohttp behind the lean client's interface (``https://``: TLS, CDNs), and the requests- and
tokens-per-minute limits both clients are paced by."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from .http11 import READ_STEP, Reply, Sink, TransportError

_JSON = {"Content-Type": "application/json"}


class AiohttpClient:
    """aiohttp behind the lean client's interface (for `https://`, or ``http = "aiohttp"``)."""

    def __init__(
        self, url: str, headers: dict[str, str], timeout_s: float, concurrency: int, limit: int
    ) -> None:
        self.url = url
        self.limit = limit
        self.session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(limit=concurrency, ttl_dns_cache=300),
        )

    async def post(self, body: bytes, sink: Sink | None = None) -> Reply:
        try:
            async with self.session.post(
                self.url, data=body, headers=_JSON, allow_redirects=False
            ) as r:
                got = {k.lower(): v for k, v in r.headers.items()}
                feed = sink(got) if sink is not None and r.status == 200 else None
                if feed is not None:  # aiohttp has decoded any gzip already
                    while chunk := await r.content.readany():
                        if feed(chunk):
                            r.close()  # hung up: the connection is not kept
                            return Reply(r.status, got, b"", fed=True, stopped=True)
                    return Reply(r.status, got, b"", fed=True)
                data = bytearray()  # counted while reading: a body never sits whole past it
                while len(data) <= self.limit:
                    chunk = await r.content.read(READ_STEP)
                    if not chunk:
                        return Reply(r.status, got, bytes(data))
                    data += chunk
                return Reply(r.status, got, bytes(data[: self.limit]), cut=True)
        except aiohttp.ClientConnectorError as e:  # no connection: nothing reached the server
            raise TransportError(type(e).__name__, str(e), sent=False) from e
        except aiohttp.ClientError as e:
            raise TransportError(type(e).__name__, str(e)) from e

    async def aclose(self) -> None:
        await self.session.close()


class RateLimiter:
    """Token bucket: ``per_minute`` units, refilled continuously."""

    def __init__(self, per_minute: float) -> None:
        self.capacity = per_minute
        self.tokens = per_minute
        self.rate = per_minute / 60.0
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    async def acquire(self, n: float = 1.0) -> None:
        n = min(n, self.capacity)
        async with self.lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= n:
                    self.tokens -= n
                    return
                await asyncio.sleep((n - self.tokens) / self.rate)
