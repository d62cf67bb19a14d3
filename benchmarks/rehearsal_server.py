"""Kimi K2.5 answers in OpenRouter's shape, for the rehearsal (`benchmarks/rehearsal.py`).

An OpenAI-compatible chat-completions server on loopback (Starlette + uvicorn, as
`draftdata.devtools.replay` is built) that answers every request, whole or streamed
(``stream: true``), the way OpenRouter returns ``moonshotai/kimi-k2.5``:

- top level: ``id`` (``gen-...``), ``provider`` (one of ``PROVIDERS``), ``model``, ``object``,
  ``created``, ``system_fingerprint``;
- ``choices[0]``: ``message`` with ``role``, ``content``, ``refusal: null``, ``reasoning`` and
  ``reasoning_details: [{"type": "reasoning.text", "text", "format": "unknown", "index": 0}]``
  (both, as OpenRouter sends them), and ``tool_calls`` (``arguments`` a JSON string) where the
  request has ``tools``; ``finish_reason`` with ``native_finish_reason``, ``logprobs: null``;
- ``usage``: ``prompt_tokens``, ``completion_tokens``, ``total_tokens``, ``cost`` (USD at
  ``--price-in`` / ``--price-out`` per million tokens), ``is_byok``,
  ``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``.

Streamed, it sends OpenRouter's ``: OPENROUTER PROCESSING`` comment at once, then chunks
(``delta`` with ``reasoning`` + ``reasoning_details``, then ``content``, then each tool call
whole), a last chunk with the finish reason, a usage chunk with ``choices: []``, and
``[DONE]``.

**Text.** Reasoning and content are paragraphs of real ShareGPT answers (``gpt`` turns, split at
blank lines, mostly-ASCII prose; fenced code blocks kept whole for code prompts), joined by
``"\\n\\n"``, never the same paragraph twice in one answer, so they tokenize like language. Each
paragraph's Kimi token count is measured once at start; an answer's count is their sum plus the
separators, which is what Kimi's pre-tokenizer gives the joined text (it splits at newline runs:
``Pool.check`` measures it on a sample at start and /stats reports the result).

**Lengths** (Kimi tokens, per request): reasoning log-normal, median ``--reasoning-median``
(1,800; 800 where the request has tools), sigma 0.75, clipped to [500, 8,000]; content
log-normal, median 450, sigma 0.8, clipped to [20, 4,000], code blocks mixed in where the
prompt asks for code. With tools, ``--tool-rate`` (0.85) of answers call 1-4 of them (arguments
drawn from each schema: required properties always, optional ones at 0.3), with no content
(0.7) or one short paragraph before the calls. ``--length-rate`` (0.01) of answers think until
``max_tokens`` and end ``length`` with no content.

**Latency** (per request, modelled in real seconds, then multiplied by ``--time-scale``): time
to first token log-normal, median 1.5 s, sigma 0.6, clipped to [0.3, 20]; decode rate
log-normal, median 40 tokens/s, sigma 0.35, clipped to [8, 150] (what OpenRouter's providers
show for Kimi K2.5: a second or two to the first reasoning token, tens of tokens a second).
A streamed answer is paced to that schedule, its chunks holding ``--chunk-tokens`` tokens
(16; real providers send 1-4) and written at most every ``--tick`` wall seconds (0.05: one
write carries every chunk then due, so 256 streams do not outrun one Python process). A
whole answer waits its full time, then comes at once.

Everything an answer holds (text, calls, lengths, latency, provider) is a pure function of
``--seed`` and the request's messages, tools and ``max_tokens``: a resumed run that asks the
same request gets the same answer. ``GET /stats`` counts what was served.

    python benchmarks/rehearsal_server.py --port 0 [--time-scale 0.02] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import re
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
SHAREGPT = SHARED / "data" / "prompts" / "sharegpt_v3_first1000.json"
KIMI = SHARED / "tokenizers" / "kimi-k2"

MODEL = "moonshotai/kimi-k2.5"
#: OpenRouter's providers for Kimi K2.5; those marked True pass the model's own tool-call ids
#: (``functions.NAME:N``) through, the others write ``call_...``
PROVIDERS = {"Moonshot AI": True, "Chutes": True, "Together": False, "Fireworks": False}
FENCE = re.compile(r"```[^\n`]*\n.*?\n```", re.S)
CODE_HINT = re.compile(r"```|\bdef |\bcode\b|\bpython\b|\bfunction\b|\bprogram", re.I)
_SEP = "\n\n"


def lognormal(rng: random.Random, median: float, sigma: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, median * math.exp(rng.gauss(0.0, sigma))))


@dataclass(frozen=True)
class Model:
    """The stated distributions (see the module docstring), as the CLI sets them."""

    seed: int = 0
    time_scale: float = 0.02
    reasoning_median: float = 1800.0
    reasoning_median_tools: float = 800.0
    reasoning_sigma: float = 0.75
    reasoning_range: tuple[int, int] = (500, 8000)
    content_median: float = 450.0
    content_sigma: float = 0.8
    content_range: tuple[int, int] = (20, 4000)
    tool_rate: float = 0.85
    length_rate: float = 0.01
    ttft_median_s: float = 1.5
    ttft_sigma: float = 0.6
    ttft_range: tuple[float, float] = (0.3, 20.0)
    tps_median: float = 40.0
    tps_sigma: float = 0.35
    tps_range: tuple[float, float] = (8.0, 150.0)
    chunk_tokens: int = 16
    tick_s: float = 0.05
    price_in: float = 0.60
    price_out: float = 3.00


class Pool:
    """Paragraphs of real answers with their Kimi token counts."""

    def __init__(self, tokenizer: Any, path: Path = SHAREGPT) -> None:
        prose: set[str] = set()
        code: set[str] = set()
        for conv in json.loads(path.read_text(encoding="utf-8")):
            for turn in conv.get("conversations") or []:
                if turn.get("from") != "gpt" or not isinstance(turn.get("value"), str):
                    continue
                text = turn["value"]
                for m in FENCE.finditer(text):
                    block = m.group(0).strip()
                    if 40 <= len(block) <= 3000 and self._clean(block):
                        code.add(block)
                for p in re.split(r"\n\s*\n", FENCE.sub(_SEP, text)):
                    p = p.strip()
                    ascii_share = sum(c < "\x80" for c in p) / max(1, len(p))
                    if 40 <= len(p) <= 2000 and ascii_share >= 0.97 and self._clean(p):
                        prose.add(p)
        self.prose = sorted(prose)
        self.code = sorted(code)
        self.tokenizer = tokenizer
        texts = self.prose + self.code
        counts = [len(c) for c in tokenizer.encode_batch(texts)]
        # a paragraph's tokens when a separator follows it: a pre-token of punctuation takes
        # the newlines after it (``.\n\n`` can be one token), so the separator is counted
        # with the paragraph it follows; what follows a newline run starts a new pre-token
        joined = [len(c) for c in tokenizer.encode_batch([t + _SEP for t in texts])]
        k = len(self.prose)
        self.prose_tok, self.code_tok = counts[:k], counts[k:]
        self.prose_sep, self.code_sep = joined[:k], joined[k:]
        words = {w for p in self.prose[:3000] for w in re.findall(r"\b[A-Za-z]{4,12}\b", p)}
        self.words = sorted(words)

    @staticmethod
    def _clean(text: str) -> bool:
        """No control-token text (``<|...|>``, think markers): the answers stay plain text."""
        return "<|" not in text and "think>" not in text and "\r" not in text

    def draw(
        self, rng: random.Random, target: int, code_share: float = 0.0, cap: int | None = None
    ) -> tuple[str, int]:
        """Paragraphs (each at most once) until ``target`` tokens are reached, or, with
        ``cap``, as many as fit under it. Returns (text, tokens)."""
        parts: list[str] = []
        used: set[tuple[int, int]] = set()
        n = 0
        sep_extra = 0  # what a separator after the last paragraph adds
        tries = 0
        while n < target and tries < 100_000:
            tries += 1
            kind = 1 if self.code and rng.random() < code_share else 0
            texts = self.code if kind else self.prose
            toks, seps = (
                (self.code_tok, self.code_sep) if kind else (self.prose_tok, self.prose_sep)
            )
            i = rng.randrange(len(texts))
            if (kind, i) in used:
                continue
            add = toks[i] + (sep_extra if parts else 0)
            if cap is not None and n + add > cap:
                if parts:
                    break
                continue
            used.add((kind, i))
            parts.append(texts[i])
            sep_extra = seps[i] - toks[i]
            n += add
        return _SEP.join(parts), n

    def check(self, n: int = 200, seed: int = 1) -> dict[str, Any]:
        """Summed counts against encoding the joined text whole, on ``n`` drawn answers."""
        rng = random.Random(seed)
        exact, worst = 0, 0
        for _ in range(n):
            text, counted = self.draw(rng, rng.randint(100, 4000), code_share=0.3)
            real = len(self.tokenizer.encode(text))
            exact += real == counted
            worst = max(worst, abs(real - counted))
        return {"answers": n, "exact": exact, "max_abs_diff": worst}

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text)) if text else 0


# --------------------------------------------------------------------------- one answer
@dataclass
class Answer:
    reasoning: str
    content: str
    calls: list[dict[str, Any]]
    finish: str
    reasoning_tokens: int
    completion_tokens: int
    prompt_tokens: int
    ttft_s: float
    tps: float
    provider: str
    gen_id: str

    @property
    def latency_s(self) -> float:
        """The modelled real latency (unscaled)."""
        return self.ttft_s + self.completion_tokens / self.tps


def request_key(body: dict[str, Any], seed: int) -> bytes:
    canon = json.dumps(
        [seed, body.get("messages"), body.get("tools"), body.get("max_tokens")],
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.blake2b(canon.encode("utf-8"), digest_size=16).digest()


def _value(rng: random.Random, schema: Any, words: Sequence[str], depth: int = 0) -> Any:
    if not isinstance(schema, dict):
        return rng.choice(words)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("integer", "int"):
        return rng.randint(1, 500)
    if kind in ("number", "float"):
        return round(rng.uniform(0, 1000), 2)
    if kind in ("boolean", "bool"):
        return rng.random() < 0.5
    if kind in ("array", "tuple") and depth < 3:
        return [
            _value(rng, schema.get("items"), words, depth + 1) for _ in range(rng.randint(1, 3))
        ]
    if kind in ("object", "dict") and depth < 3:
        return _arguments(rng, schema, words, depth + 1)
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))


def _arguments(
    rng: random.Random, params: Any, words: Sequence[str], depth: int = 0
) -> dict[str, Any]:
    props = params.get("properties") if isinstance(params, dict) else None
    if not isinstance(props, dict):
        return {}
    required = set(params.get("required") or [])
    return {
        name: _value(rng, schema, words, depth)
        for name, schema in props.items()
        if name in required or rng.random() < 0.3
    }


def _prompt_tokens(pool: Pool, body: dict[str, Any]) -> int:
    texts = []
    for m in body.get("messages") or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list):
            c = "".join(p.get("text") or "" for p in c if isinstance(p, dict))
        texts.append(c if isinstance(c, str) else "")
        for tc in (m.get("tool_calls") or []) if isinstance(m, dict) else []:
            texts.append(json.dumps(tc, ensure_ascii=False))
    if body.get("tools"):
        texts.append(json.dumps(body["tools"], ensure_ascii=False, separators=(",", ":")))
    counts = pool.tokenizer.encode_batch([t for t in texts if t]) if any(texts) else []
    # each message's role header, middle and end markers: 4 tokens in Kimi's template
    return sum(len(c) for c in counts) + 4 * len(body.get("messages") or []) + 3


def plan(pool: Pool, model: Model, body: dict[str, Any]) -> Answer:
    """The answer to ``body``: a pure function of the model's seed and the request."""
    key = request_key(body, model.seed)
    rng = random.Random(int.from_bytes(key, "big"))
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16384
    last_user = next(
        (
            m.get("content")
            for m in reversed(body.get("messages") or [])
            if isinstance(m, dict) and m.get("role") == "user"
        ),
        "",
    )
    code_share = 0.4 if isinstance(last_user, str) and CODE_HINT.search(last_user) else 0.0
    provider = sorted(PROVIDERS)[rng.randrange(len(PROVIDERS))]
    ttft = lognormal(rng, model.ttft_median_s, model.ttft_sigma, *model.ttft_range)
    tps = lognormal(rng, model.tps_median, model.tps_sigma, *model.tps_range)
    lo, hi = model.reasoning_range
    median = model.reasoning_median_tools if tools else model.reasoning_median
    calls: list[dict[str, Any]] = []
    if rng.random() < model.length_rate:  # thinks until max_tokens
        reasoning, r_tok = pool.draw(rng, max_tokens, cap=max_tokens)
        content, c_tok, finish, extra = "", 0, "length", 0
    else:
        target = int(lognormal(rng, median, model.reasoning_sigma, lo, hi))
        reasoning, r_tok = pool.draw(rng, target, cap=max_tokens - 64)
        finish, extra = "stop", 2  # </think> and <|im_end|>
        if tools and rng.random() < model.tool_rate:
            content, c_tok = ("", 0) if rng.random() < 0.7 else pool.draw(rng, 20)
            native = PROVIDERS[provider]
            for i in range(min(len(tools) * 2, 1 + int(rng.expovariate(1.6)), 4)):
                fn = tools[(rng.randrange(len(tools)) + i) % len(tools)].get("function") or {}
                name = str(fn.get("name") or "tool")
                args = json.dumps(_arguments(rng, fn.get("parameters"), pool.words))
                cid = f"functions.{name}:{i}" if native else f"call_{rng.getrandbits(96):024x}"
                calls.append({"id": cid, "name": name, "arguments": args})
            finish = "tool_calls"
            # the section's 2 markers, each call's 3 markers, its id and its arguments
            extra += 2 + sum(
                3 + pool.count(f"functions.{c['name']}:{i}") + pool.count(c["arguments"])
                for i, c in enumerate(calls)
            )
        else:
            room = max(1, max_tokens - r_tok - extra)
            c_target = int(lognormal(rng, model.content_median, model.content_sigma, 20, 4000))
            content, c_tok = pool.draw(rng, min(c_target, room), code_share, cap=room)
    return Answer(
        reasoning=reasoning,
        content=content,
        calls=calls,
        finish=finish,
        reasoning_tokens=r_tok,
        # + the template's prefilled <think>, which the provider counts as completion (a real
        # OpenRouter answer of Kimi K2.5: issue 55; draftdata's openrouter profile says so)
        completion_tokens=1 + r_tok + c_tok + extra,
        prompt_tokens=_prompt_tokens(pool, body),
        ttft_s=ttft,
        tps=tps,
        provider=provider,
        gen_id=f"gen-{int(time.time())}-{key.hex()[:20]}",
    )


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def usage(model: Model, a: Answer) -> dict[str, Any]:
    cost = (a.prompt_tokens * model.price_in + a.completion_tokens * model.price_out) / 1e6
    return {
        "prompt_tokens": a.prompt_tokens,
        "completion_tokens": a.completion_tokens,
        "total_tokens": a.prompt_tokens + a.completion_tokens,
        "cost": round(cost, 8),
        "is_byok": False,
        "prompt_tokens_details": {"cached_tokens": 0},
        "cost_details": {"upstream_inference_cost": None},
        "completion_tokens_details": {"reasoning_tokens": a.reasoning_tokens},
    }


def _details(text: str) -> list[dict[str, Any]]:
    return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]


def _wire_calls(a: Answer) -> list[dict[str, Any]]:
    return [
        {
            "id": c["id"],
            "index": i,
            "type": "function",
            "function": {"name": c["name"], "arguments": c["arguments"]},
        }
        for i, c in enumerate(a.calls)
    ]


def whole_body(model: Model, a: Answer, created: int) -> bytes:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": a.content,
        "refusal": None,
        "reasoning": a.reasoning,
        "reasoning_details": _details(a.reasoning),
    }
    if a.calls:
        message["tool_calls"] = _wire_calls(a)
    body = {
        "id": a.gen_id,
        "provider": a.provider,
        "model": MODEL,
        "object": "chat.completion",
        "created": created,
        "choices": [
            {
                "logprobs": None,
                "finish_reason": a.finish,
                "native_finish_reason": a.finish,
                "index": 0,
                "message": message,
            }
        ],
        "system_fingerprint": "fpv0_rehearsal",
        "usage": usage(model, a),
    }
    return _dumps(body).encode("utf-8")


def _pieces(text: str, tokens: int, chunk_tokens: int) -> list[tuple[str, int]]:
    """``text`` cut into pieces of about ``chunk_tokens`` tokens each (by characters, in
    proportion), with each piece's share of the tokens."""
    if not text:
        return []
    n = max(1, math.ceil(tokens / chunk_tokens))
    step = max(1, math.ceil(len(text) / n))
    out = [text[i : i + step] for i in range(0, len(text), step)]
    per = tokens / len(out)
    return [(p, round(per * (k + 1)) - round(per * k)) for k, p in enumerate(out)]


# --------------------------------------------------------------------------- the app
@dataclass
class Stats:
    requests: int = 0
    streamed: int = 0
    whole: int = 0
    completed: int = 0
    disconnected: int = 0
    bad_requests: int = 0
    events: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    #: usage.cost of the answers sent whole (a stream the client hung up on is not in it)
    cost_usd: float = 0.0
    #: usage.cost of every request planned, hung-up streams included
    cost_usd_asked: float = 0.0
    modelled_latency_s: float = 0.0
    finish: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "finish"}
        out["finish"] = dict(self.finish)
        out["cost_usd"] = round(self.cost_usd, 6)
        out["cost_usd_asked"] = round(self.cost_usd_asked, 6)
        return out


def make_app(pool: Pool, model: Model) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    st = Stats()
    check = pool.check()

    def error(status: int, message: str) -> Response:
        st.bad_requests += 1
        body = {"error": {"message": message, "code": status}}
        return Response(_dumps(body), status_code=status, media_type="application/json")

    async def chat(request: Request) -> Response:
        st.requests += 1
        try:
            body = json.loads(await request.body())
        except ValueError:
            return error(400, "request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return error(400, "'messages' must be a list")
        a = plan(pool, model, body)
        st.prompt_tokens += a.prompt_tokens
        st.completion_tokens += a.completion_tokens
        st.reasoning_tokens += a.reasoning_tokens
        st.cost_usd_asked += usage(model, a)["cost"]
        st.modelled_latency_s += a.latency_s
        st.finish[a.finish] += 1
        created = int(time.time())
        scale = model.time_scale
        if body.get("stream") is not True:
            st.whole += 1
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
            try:
                await asyncio.sleep(a.latency_s * scale)
            finally:
                st.in_flight -= 1
            st.completed += 1
            st.cost_usd += usage(model, a)["cost"]
            return Response(whole_body(model, a, created), media_type="application/json")
        st.streamed += 1
        return StreamingResponse(stream(a, created), media_type="text/event-stream")

    async def stream(a: Answer, created: int) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        head = (
            f'data: {{"id":"{a.gen_id}","provider":{_dumps(a.provider)},"model":"{MODEL}",'
            f'"object":"chat.completion.chunk","created":{created},"choices":[{{"index":0,'
            '"delta":'
        )
        tail = ',"finish_reason":null,"native_finish_reason":null,"logprobs":null}]}\n\n'
        events: list[tuple[str, int]] = [('{"role":"assistant","content":""}', 0)]
        for piece, n in _pieces(a.reasoning, a.reasoning_tokens, model.chunk_tokens):
            delta = {
                "role": "assistant",
                "content": "",
                "reasoning": piece,
                "reasoning_details": _details(piece),
            }
            events.append((_dumps(delta), n))
        content_tok = a.completion_tokens - a.reasoning_tokens
        for piece, n in _pieces(a.content, content_tok, model.chunk_tokens):
            events.append((_dumps({"role": "assistant", "content": piece}), n))
        for call in _wire_calls(a):
            delta = {"role": "assistant", "content": None, "tool_calls": [call]}
            events.append((_dumps(delta), 0))
        last = {
            "id": a.gen_id,
            "provider": a.provider,
            "model": MODEL,
            "object": "chat.completion.chunk",
            "created": created,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "finish_reason": a.finish,
                    "native_finish_reason": a.finish,
                    "logprobs": None,
                }
            ],
            "system_fingerprint": "fpv0_rehearsal",
        }
        end = {**last, "choices": [], "usage": usage(model, a)}
        scale = model.time_scale
        start = loop.time()
        first = start + a.ttft_s * scale
        per_token = scale / a.tps
        st.in_flight += 1
        st.max_in_flight = max(st.max_in_flight, st.in_flight)
        done = False
        try:
            yield b": OPENROUTER PROCESSING\n\n"
            await asyncio.sleep(max(0.0, first - loop.time()))
            emitted, i = 0, 0
            while i < len(events):
                now = loop.time()
                batch: list[str] = []
                while i < len(events):
                    delta, n = events[i]
                    if batch and first + (emitted + n) * per_token > now:
                        break
                    batch.append(head + delta + tail)
                    emitted += n
                    i += 1
                st.events += len(batch)
                yield "".join(batch).encode("utf-8")
                if i < len(events):
                    due = first + (emitted + events[i][1]) * per_token
                    await asyncio.sleep(max(model.tick_s, due - loop.time()))
            yield (f"data: {_dumps(last)}\n\ndata: {_dumps(end)}\n\ndata: [DONE]\n\n".encode())
            done = True
        finally:
            st.in_flight -= 1
            if done:
                st.completed += 1
                st.cost_usd += usage(model, a)["cost"]
            else:
                st.disconnected += 1

    async def stats(request: Request) -> Response:
        return Response(
            _dumps({**st.to_json(), "count_check": check}), media_type="application/json"
        )

    async def models(request: Request) -> Response:
        body = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
        return Response(_dumps(body), media_type="application/json")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/stats", stats, methods=["GET"]),
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-scale", type=float, default=Model.time_scale)
    ap.add_argument("--chunk-tokens", type=int, default=Model.chunk_tokens)
    ap.add_argument("--tick", type=float, default=Model.tick_s)
    ap.add_argument("--tool-rate", type=float, default=Model.tool_rate)
    ap.add_argument("--length-rate", type=float, default=Model.length_rate)
    ap.add_argument("--reasoning-median", type=float, default=Model.reasoning_median)
    ap.add_argument("--ttft-median", type=float, default=Model.ttft_median_s)
    ap.add_argument("--tps-median", type=float, default=Model.tps_median)
    ap.add_argument("--price-in", type=float, default=Model.price_in)
    ap.add_argument("--price-out", type=float, default=Model.price_out)
    args = ap.parse_args(argv)
    import uvicorn

    from draftdata.tokenizers import load_tokenizer

    model = Model(
        seed=args.seed,
        time_scale=args.time_scale,
        chunk_tokens=args.chunk_tokens,
        tick_s=args.tick,
        tool_rate=args.tool_rate,
        length_rate=args.length_rate,
        reasoning_median=args.reasoning_median,
        ttft_median_s=args.ttft_median,
        tps_median=args.tps_median,
        price_in=args.price_in,
        price_out=args.price_out,
    )
    t0 = time.perf_counter()
    pool = Pool(load_tokenizer(KIMI))
    app = make_app(pool, model)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    print(
        f"rehearsal-server: {len(pool.prose)} paragraphs, {len(pool.code)} code blocks "
        f"({time.perf_counter() - t0:.1f} s); listening on http://127.0.0.1:{port}/v1",
        flush=True,
    )
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", backlog=4096
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
