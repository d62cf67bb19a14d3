"""Throughput of `draftdata.replay` on loopback: requests/s at a fixed concurrency.

The server runs in its own process (as `replay-server` would). Two clients drive it: a raw
asyncio HTTP/1.1 keep-alive client (measures the server) and one httpx AsyncClient (what our
backends use; at concurrency 64 httpx itself is the bottleneck). `GET /health` is the baseline
(the cheapest Starlette route on the same server): chat-completions is reported as a ratio to it.

    python benchmarks/replay_throughput.py [GT.jsonl] [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import time
from pathlib import Path
from typing import Any

import httpx

DEFAULT_GT = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "data"
    / "groundtruth"
    / "smollm2-135m-instruct.dev.jsonl"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(path: str, port: int, token_ids: bool) -> None:
    from draftdata.devtools.replay import serve

    serve(Path(path), "127.0.0.1", port, None, 0, token_ids, 0.0)


async def _run_httpx(
    base: str, n: int, conc: int, bodies: list[dict[str, Any]] | None
) -> tuple[float, int]:
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    ok = 0
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        it = iter(range(n))

        async def worker() -> None:
            nonlocal ok
            for i in it:
                if bodies is None:
                    r = await client.get("/health")
                else:
                    r = await client.post("/v1/chat/completions", json=bodies[i % len(bodies)])
                ok += r.status_code == 200

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        return time.perf_counter() - t0, ok


def _raw_request(body: dict[str, Any] | None) -> bytes:
    if body is None:
        return b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n"
    data = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
    )


async def _run_raw(
    base: str, n: int, conc: int, bodies: list[dict[str, Any]] | None
) -> tuple[float, int]:
    host, port = base.removeprefix("http://").split(":")
    reqs = [_raw_request(None)] if bodies is None else [_raw_request(b) for b in bodies]
    it = iter(range(n))
    ok = 0

    async def worker() -> None:
        nonlocal ok
        reader, writer = await asyncio.open_connection(host, int(port))
        for i in it:
            writer.write(reqs[i % len(reqs)])
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            ok += head.startswith(b"HTTP/1.1 200")
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return time.perf_counter() - t0, ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gt", nargs="?", type=Path, default=DEFAULT_GT)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--httpx-requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--token-ids", action="store_true")
    args = ap.parse_args()
    recs = [json.loads(line) for line in args.gt.read_text(encoding="utf-8").splitlines() if line]
    bodies = [
        {"model": "m", "messages": r["messages"], "return_token_ids": args.token_ids} for r in recs
    ]
    port = _free_port()
    proc = mp.get_context("spawn").Process(
        target=_serve, args=(str(args.gt), port, args.token_ids), daemon=True
    )
    proc.start()
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        asyncio.run(_run_raw(base, 500, args.concurrency, bodies))  # warm-up
        for client, run in (("raw", _run_raw), ("httpx", _run_httpx)):
            n = args.requests if client == "raw" else args.httpx_requests
            rates = []
            for name, b in (("GET /health", None), ("POST /v1/chat/completions", bodies)):
                dt, ok = asyncio.run(run(base, n, args.concurrency, b))
                rates.append(n / dt)
                print(
                    f"{client:5s} c={args.concurrency} {name:26s} {n / dt:7.0f} req/s ({ok}/{n} ok)"
                )
            print(f"{client:5s} ratio chat/health: {rates[1] / rates[0]:.2f}")
    finally:
        proc.terminate()
        proc.join()


if __name__ == "__main__":
    main()
