"""Any OpenAI-compatible chat-completions endpoint (OpenRouter, vLLM, SGLang, transformers serve).

Bounded concurrency over the lean HTTP/1.1 client (``http11``) for `http://` servers (the
client's CPU limits a fast local server) or aiohttp for `https://` (httpx's pool cost O(connections)
a request). A timeout per request, retries (Retry-After honoured, else exponential backoff with
jitter), requests- and tokens-per-minute limits, ``extra_body`` passed through, and a capability
probe: where the server returns exact token ids (vLLM ``return_token_ids``), they are asked for
and stored. In a run with a budget answers are streamed (``streaming.StreamWatch``): one that runs
far past ``max_tokens`` is hung up on at the limit instead of paid whole."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ...config import Manifest, OpenAIBackendCfg, redact_url
from ...errors import DraftdataError
from ...formats import BoundFormat
from ...records import ApiView
from ...records.servers import profile as server_profile
from ...records.wire import WireAnswer, ids_field, messages_to_wire, parse_answer
from ...shown import redact, shown
from .aio import AiohttpClient, RateLimiter
from .base import Backend, Began, BudgetRefused, Completion, FailedAttempt, GenRequest, OnFailure
from .charges import (
    BYTES_PER_TOKEN,
    RUNAWAY_FACTOR,
    RUNAWAY_SLACK,
    answer_tokens,
    attempt_paid,
    charge,
)
from .http11 import LeanHttp, Reply, TransportError
from .reach import reachable
from .retry import (
    AUTH_STATUSES,
    PROBE_REFUSED,
    STREAM_REFUSED,
    Sent,
    refused_option,
    retry_after,
    retry_delay,
    will_retry,
)
from .serving import auth_headers, error_text
from .streaming import StreamWatch


class BackendConfigError(DraftdataError):
    """A backend cannot start as configured."""


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
        self.headers = auth_headers(cfg)
        #: the API key, kept out of everything stored or shown of a failure
        self.key = key
        why = reachable(cfg.base_url)
        if why is not None:  # name it now: not after 90 refused attempts and 40 s
            raise BackendConfigError(
                f"backend {name}: {shown}: {why}; is the server running? nothing was "
                "sent (`draftdata plan MANIFEST` checks every backend before a run)"
            )
        # the endpoint's path goes before a query string (some gateways take ?api-version=...)
        u = urlsplit(cfg.base_url)
        self.url = urlunsplit(u._replace(path=u.path + "/chat/completions"))
        self._transport: LeanHttp | AiohttpClient | None = None
        self.sem = asyncio.Semaphore(cfg.concurrency)
        self.rpm = RateLimiter(cfg.rpm) if cfg.rpm else None
        self.tpm = RateLimiter(cfg.tpm) if cfg.tpm else None
        self.rng = random.Random(seed)
        self.token_ids: bool | None = {"auto": None, "always": True, "never": False}[cfg.token_ids]
        self.streaming = cfg.stream == "always" or (
            cfg.stream == "auto" and m.run.budget_usd is not None
        )
        self._probe = asyncio.Lock()

    @property
    def transport(self) -> LeanHttp | AiohttpClient:
        if self._transport is None:  # created inside the running event loop
            lean = self.cfg.http == "lean" or (
                self.cfg.http == "auto" and self.url.startswith("http://")
            )
            self._transport = (
                LeanHttp(
                    self.url,
                    headers=self.headers,
                    timeout_s=self.cfg.timeout_s,
                    max_body=self.cfg.max_answer_bytes,
                )
                if lean
                else AiohttpClient(
                    self.url,
                    self.headers,
                    self.cfg.timeout_s,
                    self.cfg.concurrency,
                    self.cfg.max_answer_bytes,
                )
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
        if self.streaming:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def run_batch(
        self, requests: Sequence[GenRequest], on_failure: OnFailure
    ) -> list[Completion | None]:
        if len(requests) == 1:  # the runner's one request: no task of its own to gather
            return [await self.one(requests[0], on_failure)]
        return list(await asyncio.gather(*(self.one(r, on_failure) for r in requests)))

    async def one(self, req: GenRequest, on_failure: OnFailure) -> Completion | None:
        async with self.sem:
            if self.fatal:
                return None
            if self.token_ids is None:
                async with self._probe:  # the first request doubles as the capability probe
                    if self.token_ids is None:
                        return await self._attempts(req, on_failure, probing=True)
                if self.fatal:  # the probe's answer stopped the backend
                    return None
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
            try:
                intent = await self.before_send(req) if self.before_send is not None else None
            except BudgetRefused:
                return None  # not sent: the key stays pending for a run with more budget
            sent = await self._send(req, body)
            reason = sent.reason
            settled: float | None = None  # an answer's own cost, where it came and is not kept
            if reason is None and sent.reply is not None and sent.text is not None:
                done = self._parse(
                    req, body, sent.reply, sent.text, sent.t0, sent.latency, probing, with_ids,
                    sent.watch,
                )  # fmt: skip
                if not isinstance(done, Completion):
                    reason = done
                elif not _is_empty(done) or attempt >= self.cfg.empty_retries:
                    # an answer still empty after its retries is kept as such
                    return replace(done, intent=intent)
                else:
                    reason, settled = "empty_response", done.cost_usd
            refused = self._refused_option(sent, probing)
            if refused is not None:  # asked again at once, without the option refused
                probing = probing and refused != PROBE_REFUSED
                on_failure(
                    req,
                    FailedAttempt(
                        refused, sent.status, body, sent.text, sent.t0, sent.latency, False,
                        intent=intent,
                    ),
                )  # fmt: skip
                continue
            wait = self._failed(
                req, on_failure, body, sent, reason or "no_body", attempt, intent, settled
            )
            if wait is None:
                return None
            await asyncio.sleep(wait)
            attempt += 1

    async def _send(self, req: GenRequest, body: str) -> Sent:
        """One attempt on the wire: the reply as it came, or the reason it did not."""
        began = Began.now()
        status: int | None = None
        headers: dict[str, str] = {}
        text: str | None = None
        reply: Reply | None = None
        detail = ""
        unsent = False
        watch = self._watch(req) if self.streaming else None
        try:
            reply = await self.transport.post(
                body.encode("utf-8"), watch.sink if watch is not None else None
            )
            status, headers = reply.status, reply.headers
            if reply.fed and watch is not None:
                reason = watch.ended()  # the events put back together, as one answer
                text = watch.text()
                detail = watch.asm.error or ""
            else:
                watch = None
                # undecodable bytes are kept as they came (surrogate escapes; the ledger's
                # codec writes them back as the same bytes)
                text = reply.body.decode("utf-8", errors="surrogateescape")
                reason = None if status == 200 else f"http_{status}"
        except TimeoutError:
            reason = "timeout"
        except TransportError as e:
            reason = f"connection_error:{e.reason}"
            unsent = not e.sent
        return Sent(
            began.wall, began.elapsed(), status, headers, text, reply, reason, detail, watch,
            unsent,
        )  # fmt: skip

    def _refused_option(self, sent: Sent, probing: bool) -> str | None:
        """The option the server refused (``retry.refused_option``), turned off for every
        later request; None if none."""
        refused = refused_option(sent, probing, self.streaming and self.cfg.stream == "auto")
        if refused == PROBE_REFUSED:
            self.token_ids = False  # the server refuses the extension: plain text from now
        elif refused == STREAM_REFUSED:
            self.streaming = False  # whole answers from now: the old bound on runaways
        return refused

    def _failed(
        self, req: GenRequest, on_failure: OnFailure, body: str, sent: Sent, reason: str,
        attempt: int, intent: int | None, settled: float | None = None,
    ) -> float | None:  # fmt: skip
        """A failed attempt, recorded with what it may have cost (``paid``); the seconds to
        wait before the next one, None when it was the last (a refused key also stops the
        backend)."""
        status, headers = sent.status, sent.headers
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
        detail = error_text(sent.text) if status not in (None, 200) else sent.detail
        # the server's words, verbatim but for a secret (a refusal may quote the key it got);
        # shown with their control bytes visible (they reach a terminal: `status --failed`)
        detail = shown(detail, (self.key,))
        text = redact(sent.text, (self.key,)) if sent.text is not None else None
        wait = retry_delay(attempt, headers, self.rng, self.cfg.backoff_s) if retry else 0.0
        asked = retry_after(headers, cap=float("inf"))
        paid = settled if settled is not None else attempt_paid(self.cfg, req, sent)
        on_failure(
            req,
            FailedAttempt(
                reason, status, body, text, sent.t0, sent.latency, not retry, wait_s=wait,
                asked_s=asked, intent=intent, detail=detail, paid_usd=paid,
                settled=settled is not None,
            ),
        )  # fmt: skip
        return wait if retry else None

    def _parse(
        self,
        req: GenRequest,
        body: str,
        reply: Reply,
        text: str,
        t0: float,
        latency: float,
        probing: bool,
        with_ids: bool,
        watch: StreamWatch | None = None,
    ) -> Completion | str:
        """A 200 body as a Completion, or the reason to retry it (not JSON, no choices). The
        body is read once, here, by ``records.wire.parse_answer``. An answer that arrived but
        cannot be used (bytes that are not UTF-8, a body past ``max_answer_bytes``, a field of
        the wrong type or out of bounds) is still a Completion: it is paid for, so it is stored
        verbatim and quarantined with its reason."""
        size = len(reply.body)

        def unread(
            stand_in: dict[str, Any], problem: str, counted: int | None = None
        ) -> Completion:
            """A paid answer that is not parsed: stored as it came, quarantined with why."""
            got = WireAnswer(stand_in, "stop", ApiView(None, "stop"))
            return self._completion(
                req, body, text, t0, latency, got, problem=problem, counted=counted
            )

        if watch is not None and watch.asm.problem is not None:
            return unread(
                {"bad_stream": watch.asm.problem},
                f"bad_stream: {watch.asm.problem}",
                counted=max(req.sampling.max_tokens, watch.written()),
            )
        if watch is not None and watch.stopped == "oversized":
            size = watch.asm.held
            return unread(
                {"oversized_chars": size},
                f"oversized: more than {size:,} bytes of answer streamed, more than "
                f"max_answer_bytes = {self.cfg.max_answer_bytes:,} (the rest was not read)",
                counted=max(size // BYTES_PER_TOKEN, watch.written()),
            )
        if reply.cut or size > self.cfg.max_answer_bytes:
            more = "more than " if reply.cut else ""
            return unread(
                {"oversized_bytes": size},
                f"oversized: {more}{size:,} bytes, more than "
                f"max_answer_bytes = {self.cfg.max_answer_bytes:,}"
                + (" (the rest was not read)" if reply.cut else ""),
                counted=size // BYTES_PER_TOKEN,
            )
        server = self.cfg.server if self.cfg.server != "auto" else None
        got = parse_answer(text, want_ids=with_ids, server=server)
        if isinstance(got, str):  # not JSON (a body cut short, also inside a character): ask again
            return got
        try:
            reply.body.decode("utf-8")
        except UnicodeDecodeError as e:
            return unread(
                {"invalid_utf8_at": e.start},
                f"invalid_utf8: byte {e.start:,} of the body is not UTF-8",
            )
        if probing:
            ch = got.data["choices"][0]
            self.token_ids = ids_field(ch) is not None
        if watch is not None and watch.stopped == "runaway":
            n, limit = watch.tokens, req.sampling.max_tokens
            return self._completion(
                req,
                body,
                text,
                t0,
                latency,
                got,
                problem=f"runaway: the stream passed {n:,} tokens for max_tokens = {limit:,} "
                "and was stopped there",
                counted=n,
            )
        return self._completion(req, body, text, t0, latency, got, problem=got.problem)

    def _completion(
        self,
        req: GenRequest,
        body: str,
        text: str,
        t0: float,
        latency: float,
        got: WireAnswer,
        *,
        problem: str | None = None,
        counted: int | None = None,
    ) -> Completion:
        """The answer, charged what draftdata counts itself whatever ``usage`` says: its prompt
        (our rendering) and its answer (the ids, or the text in the target's tokens); the
        server's ``usage`` only where it is more. An answer far past ``max_tokens`` stops the
        backend (the server ignores the limit, so no reservation bounds what it costs)."""
        usage, view = got.usage, got.view
        if counted is None:
            if problem is not None:  # unreadable: count the most it may have been
                counted = req.sampling.max_tokens
            else:  # the text's count (None: nothing depends on it); with ids the larger:
                # the ids of "Hi." beside 960 words of text do not price the text at theirs
                ids_n = len(got.output_ids) if got.output_ids is not None else None
                counted = answer_tokens(
                    self.bound.tokenizer,
                    view,
                    priced=self.cfg.price_out_per_mtok > 0,
                    most=RUNAWAY_FACTOR * req.sampling.max_tokens + RUNAWAY_SLACK,
                    reported=usage.completion_tokens if ids_n is None else ids_n,
                )
                if ids_n is not None:
                    counted = max(ids_n, counted or 0)
        cost, note = charge(self.cfg, len(req.prompt_ids), counted, got, self.max_cost(req))
        ct, pt = usage.completion_tokens, usage.prompt_tokens
        limit = req.sampling.max_tokens
        written = max(counted or 0, ct or 0)
        if written > RUNAWAY_FACTOR * limit + RUNAWAY_SLACK:
            problem = problem or f"runaway: {written:,} tokens for max_tokens = {limit:,}"
            self.fatal = (
                f"backend {self.name}: the server ignores max_tokens: an answer of about "
                f"{written:,} tokens came back for a request of at most {limit:,} "
                f"({req.key.sample_id}); nothing more is sent to it, since no reservation "
                "bounds what it costs (the answer is stored, quarantined as runaway)"
            )
        return Completion(
            request=body,
            response=got.data,
            response_text=text,
            finish_reason=got.finish_reason,
            view=view,
            output_ids=got.output_ids if problem is None else None,
            prompt_ids=got.prompt_ids if problem is None else None,
            prompt_tokens=pt,
            completion_tokens=ct,
            cost_usd=cost,
            http_status=200,
            started_at=t0,
            latency_s=latency,
            problem=problem,
            response_is_body=bool(got.data) and "choices" in got.data,
            usage_note=note,
            counted_tokens=counted,
        )

    def _watch(self, req: GenRequest) -> StreamWatch:
        """The reader of one streamed attempt: it hangs up past the runaway limit."""
        limit = RUNAWAY_FACTOR * req.sampling.max_tokens + RUNAWAY_SLACK
        tok = self.bound.tokenizer
        return StreamWatch(limit, self.cfg.max_answer_bytes, lambda t: len(tok.encode(t)))

    def max_cost(self, req: GenRequest) -> float:
        """The most one request can cost at the manifest's prices."""
        return self.cost_usd(self.cfg, len(req.prompt_ids), req.sampling.max_tokens)

    def worst_cost(self, req: GenRequest) -> float | None:
        """Streamed, a request is hung up on past the runaway limit: what it can cost by then."""
        limit = RUNAWAY_FACTOR * req.sampling.max_tokens + RUNAWAY_SLACK
        return self.cost_usd(self.cfg, len(req.prompt_ids), limit) if self.streaming else None

    @classmethod
    def cost_usd(
        cls, cfg: OpenAIBackendCfg, prompt_tokens: float, completion_tokens: float
    ) -> float:
        return (
            prompt_tokens * cfg.price_in_per_mtok + completion_tokens * cfg.price_out_per_mtok
        ) / 1e6

    @classmethod
    def preflight(cls, name: str, cfg: OpenAIBackendCfg, m: Manifest) -> list[str]:
        """The key's variable is set and the server answers a TCP connect (no request)."""
        out = []
        if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
            out.append(
                f"backend {name}: environment variable {cfg.api_key_env} is not set; export "
                f"{cfg.api_key_env}=<your key> before the run"
            )
        why = reachable(cfg.base_url)
        if why is not None:
            out.append(f"backend {name}: {redact_url(cfg.base_url)}: {why}; is the server running?")
        return out
