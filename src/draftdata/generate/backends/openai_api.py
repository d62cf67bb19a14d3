"""Any OpenAI-compatible chat-completions endpoint (OpenRouter, vLLM, SGLang, transformers serve).

Async HTTP with bounded concurrency: the lean HTTP/1.1 client (``http11``) for `http://` servers,
where the client's CPU is what limits a fast local server; aiohttp for `https://` (TLS, CDNs).
httpx was dropped before either: its connection pool costs O(connections) per request. A timeout
per request, retries (Retry-After honoured,
otherwise exponential backoff with jitter), requests- and tokens-per-minute limits, ``extra_body``
passed through, and a capability probe: where the server returns exact token ids (vLLM
``return_token_ids``), they are asked for and stored."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import aiohttp

from ...errors import DraftdataError, InputError
from ...formats import BoundFormat
from ...manifest import Manifest
from ...records import ApiView
from ...records.wire import detect_server, messages_to_wire, view_from_message
from ...tokens.servers import profile as server_profile
from .base import Backend, Completion, FailedAttempt, GenRequest, OnFailure
from .config import OpenAIBackendCfg, redact_url
from .http11 import LeanHttp, Reply, TransportError
from .reach import reachable
from .retry import AUTH_STATUSES, PROBE_REFUSED, retry_after, retry_delay, will_retry

_JSON = {"Content-Type": "application/json"}


class _Aiohttp:
    """aiohttp behind the lean client's interface (for `https://`, or ``http = "aiohttp"``)."""

    def __init__(
        self, url: str, headers: dict[str, str], timeout_s: float, concurrency: int
    ) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(limit=concurrency, ttl_dns_cache=300),
        )

    async def post(self, body: bytes) -> Reply:
        try:
            async with self.session.post(self.url, data=body, headers=_JSON) as r:
                got = {k.lower(): v for k, v in r.headers.items()}
                return Reply(r.status, got, await r.read())
        except aiohttp.ClientError as e:
            raise TransportError(type(e).__name__, str(e)) from e

    async def aclose(self) -> None:
        await self.session.close()


class BackendConfigError(DraftdataError):
    """A backend cannot start as configured."""


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


def _int_ids(raw: Any) -> tuple[int, ...] | None:
    """Ids a server sent, where they are a list of ints (the tokens stage checks the range)."""
    if isinstance(raw, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
        return tuple(raw)
    return None


def _is_empty(c: Completion) -> bool:
    v = c.view
    return (
        c.output_ids is None
        and c.problem is None
        and not (v.content or v.reasoning or v.tool_calls)
    )


class OpenAIBackend(Backend):
    kind = "openai"

    def __init__(
        self, name: str, cfg: OpenAIBackendCfg, m: Manifest, bound: BoundFormat, seed: int = 0
    ) -> None:
        super().__init__(name)
        self.cfg = cfg
        self.bound = bound
        self.concurrency = cfg.concurrency
        self.model = m.target.model if cfg.model is None else cfg.model
        key = None
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise BackendConfigError(
                    f"backend {name}: environment variable {cfg.api_key_env} is not set; export "
                    f"{cfg.api_key_env}=<your key> (the key itself never goes in the manifest)"
                )
        shown = redact_url(cfg.base_url)
        if key and shown != cfg.base_url:
            raise BackendConfigError(
                f"backend {name}: base_url {shown} carries credentials and api_key_env is set; "
                "use one of them (the key in the variable is the usual way)"
            )
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        why = reachable(cfg.base_url)
        if why is not None:  # name it now: not after 90 refused attempts and 40 s
            raise BackendConfigError(
                f"backend {name}: {shown}: {why}; is the server running? nothing was "
                "sent (`draftdata plan MANIFEST` checks every backend before a run)"
            )
        self.url = cfg.base_url + "/chat/completions"
        self._transport: LeanHttp | _Aiohttp | None = None
        self.sem = asyncio.Semaphore(cfg.concurrency)
        self.rpm = RateLimiter(cfg.rpm) if cfg.rpm else None
        self.tpm = RateLimiter(cfg.tpm) if cfg.tpm else None
        self.rng = random.Random(seed)
        self.token_ids: bool | None = {"auto": None, "always": True, "never": False}[cfg.token_ids]
        self._probe = asyncio.Lock()

    @property
    def transport(self) -> LeanHttp | _Aiohttp:
        if self._transport is None:  # created inside the running event loop
            lean = self.cfg.http == "lean" or (
                self.cfg.http == "auto" and self.url.startswith("http://")
            )
            self._transport = (
                LeanHttp(self.url, headers=self.headers, timeout_s=self.cfg.timeout_s)
                if lean
                else _Aiohttp(self.url, self.headers, self.cfg.timeout_s, self.cfg.concurrency)
            )
        return self._transport

    async def aclose(self) -> None:
        if self._transport is not None:
            await self._transport.aclose()
            self._transport = None

    def body(self, req: GenRequest, with_ids: bool) -> dict[str, Any]:
        s = req.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages_to_wire(req.messages),
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": req.seed,
        }
        if not self.model:
            del body["model"]  # a server pinned to one model (transformers serve) wants none
        if req.tools:
            body["tools"] = list(req.tools)
        # the options that keep the server's text whole (vLLM, SGLang); extra_body may override
        body.update(server_profile(self.cfg.server).lossless_request)
        body.update(self.cfg.extra_body)
        if with_ids:
            body["return_token_ids"] = True
        return body

    async def run_batch(
        self, requests: Sequence[GenRequest], on_failure: OnFailure
    ) -> list[Completion | None]:
        return list(await asyncio.gather(*(self.one(r, on_failure) for r in requests)))

    async def one(self, req: GenRequest, on_failure: OnFailure) -> Completion | None:
        async with self.sem:
            if self.fatal:
                return None
            if self.token_ids is None:
                async with self._probe:  # the first request doubles as the capability probe
                    if self.token_ids is None:
                        return await self._attempts(req, on_failure, probing=True)
            return await self._attempts(req, on_failure, probing=False)

    async def _attempts(
        self, req: GenRequest, on_failure: OnFailure, probing: bool
    ) -> Completion | None:
        est_tokens = len(req.prompt_ids) + req.sampling.max_tokens
        attempt = 0
        while True:
            with_ids = bool(self.token_ids) or probing
            # serialized once: the same text is sent and kept in the ledger
            body = json.dumps(self.body(req, with_ids), ensure_ascii=False)
            if self.rpm:
                await self.rpm.acquire(1)
            if self.tpm:
                await self.tpm.acquire(est_tokens)
            t0 = time.time()
            status: int | None = None
            headers: dict[str, str] = {}
            text: str | None = None
            try:
                reply = await self.transport.post(body.encode("utf-8"))
                status, headers = reply.status, reply.headers
                text = reply.body.decode("utf-8", errors="replace")
                reason = None if status == 200 else f"http_{status}"
            except TimeoutError:
                reason = "timeout"
            except TransportError as e:
                reason = f"connection_error:{e.reason}"
            latency = time.time() - t0
            if reason is None and text is not None:
                done = self._parse(req, body, text, t0, latency, probing)
                if not isinstance(done, Completion):
                    reason = done
                elif not _is_empty(done) or attempt >= self.cfg.empty_retries:
                    return done  # an answer still empty after its retries is kept as such
                else:
                    reason = "empty_response"
            if probing and status in (400, 422) and text and "return_token_ids" in text:
                self.token_ids = False  # the server refuses the extension: plain text from now
                on_failure(
                    req, FailedAttempt(PROBE_REFUSED, status, body, text, t0, latency, False)
                )
                probing = False
                continue
            reason = reason or "no_body"
            if status in AUTH_STATUSES:
                self.fatal = (
                    f"backend {self.name}: the server refused the API key (HTTP {status}); "
                    + (
                        f"check the key in {self.cfg.api_key_env}"
                        if self.cfg.api_key_env
                        else "set api_key_env to the variable that holds your key"
                    )
                    + "; nothing more is sent to it"
                )
            retry = will_retry(reason, status, attempt, self.cfg.max_retries)
            wait = retry_delay(attempt, headers, self.rng, self.cfg.backoff_s) if retry else 0.0
            asked = retry_after(headers, cap=float("inf"))
            on_failure(
                req,
                FailedAttempt(
                    reason, status, body, text, t0, latency, not retry, wait_s=wait, asked_s=asked
                ),
            )
            if not retry:
                return None
            await asyncio.sleep(wait)
            attempt += 1

    def _parse(
        self,
        req: GenRequest,
        body: str,
        text: str,
        t0: float,
        latency: float,
        probing: bool,
    ) -> Completion | str:
        """A 200 body as a Completion, or the reason to retry it (not JSON, no choices). An
        answer that arrived but cannot be used (a string for a message, tool calls that are not
        a list, ids that are not ints, an answer past ``max_answer_bytes``) is still a
        Completion: it is paid for, so it is stored verbatim and quarantined with its reason."""
        if len(text) > self.cfg.max_answer_bytes:
            return self._completion(
                req,
                body,
                text,
                t0,
                latency,
                {"oversized_bytes": len(text)},
                "stop",
                ApiView(None, "stop"),
                problem=f"oversized: {len(text):,} bytes, more than "
                f"max_answer_bytes = {self.cfg.max_answer_bytes:,}",
            )
        try:
            data = json.loads(text)
        except ValueError:
            return "http_200_invalid_json"
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return "no_choices"
        ch = choices[0]
        finish = str(ch.get("finish_reason") or "stop")
        problem = None
        try:
            msg = ch.get("message") or {}
            if not isinstance(msg, dict):
                raise InputError(f"choices[0].message is a {type(msg).__name__}, not an object")
            view = view_from_message(msg, finish, ch.get("logprobs"))
            server = self.cfg.server if self.cfg.server != "auto" else detect_server(data)
            view = replace(view, server=server)
        except (InputError, AttributeError, TypeError, ValueError) as e:
            view, problem = ApiView(None, finish), f"unusable_message: {e}"
        out_ids = ch.get("token_ids")
        prompt_ids = data.get("prompt_token_ids")
        if probing:
            self.token_ids = isinstance(out_ids, list)
        return self._completion(
            req,
            body,
            text,
            t0,
            latency,
            data,
            finish,
            view,
            problem=problem,
            output_ids=_int_ids(out_ids),
            prompt_ids=_int_ids(prompt_ids),
            is_body=True,
        )

    def _completion(
        self,
        req: GenRequest,
        body: str,
        text: str,
        t0: float,
        latency: float,
        data: dict[str, Any],
        finish: str,
        view: ApiView,
        *,
        problem: str | None = None,
        output_ids: tuple[int, ...] | None = None,
        prompt_ids: tuple[int, ...] | None = None,
        is_body: bool = False,
    ) -> Completion:
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
        pt = usage.get("prompt_tokens") if usage else None
        ct = usage.get("completion_tokens") if usage else None
        if usage and isinstance(usage.get("cost"), (int, float)):
            cost = float(usage["cost"])
        elif isinstance(ct, int):
            cost = (
                (pt if isinstance(pt, int) else len(req.prompt_ids)) * self.cfg.price_in_per_mtok
                + ct * self.cfg.price_out_per_mtok
            ) / 1e6
        else:
            # no usage: charge what was reserved, or what the answer's own length costs where a
            # server ignored max_tokens and wrote more
            ct = len(output_ids) if output_ids is not None else self._count(view, text)
            cost = max(
                self.max_cost(req),
                (
                    len(req.prompt_ids) * self.cfg.price_in_per_mtok
                    + ct * self.cfg.price_out_per_mtok
                )
                / 1e6,
            )
        return Completion(
            request=body,
            response=data,
            response_text=text,
            finish_reason=finish,
            view=view,
            output_ids=output_ids,
            prompt_ids=prompt_ids,
            prompt_tokens=pt if isinstance(pt, int) else None,
            completion_tokens=ct if isinstance(ct, int) else None,
            cost_usd=cost,
            http_status=200,
            started_at=t0,
            latency_s=latency,
            problem=problem,
            response_is_body=is_body,
        )

    def _count(self, view: ApiView, text: str) -> int:
        """Completion tokens of an answer whose server reported none (our own count)."""
        answer = (view.reasoning or "") + (view.content or "")
        if not answer and view.content is None:
            return len(text.encode()) // 3  # unparsable: about three bytes a token
        return len(self.bound.tokenizer.encode(answer)) + sum(
            len(self.bound.tokenizer.encode(c.arguments)) for c in view.tool_calls
        )

    def max_cost(self, req: GenRequest) -> float:
        """The most one request can cost at the manifest's prices."""
        return (
            len(req.prompt_ids) * self.cfg.price_in_per_mtok
            + req.sampling.max_tokens * self.cfg.price_out_per_mtok
        ) / 1e6
