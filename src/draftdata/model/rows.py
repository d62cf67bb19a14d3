"""What the repair reads at one position of an answer: the model's distribution over the next
token (a :class:`Row`), from a full logits row in this process (:class:`TorchRow`) or from the
log-probabilities a server returned for it (``generate.scoring.ServerRow``), and the sampling
nucleus over it.

Whether a sampled token could have been drawn is decided here, in one place
(:func:`in_nucleus`): the probability mass of the tokens more probable than it, at the answer's
temperature, must lie below top-p, within ``NUCLEUS_MARGIN``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..records import Decoding

__all__ = [
    "NUCLEUS_MARGIN",
    "TOLERANCE",
    "GoOn",
    "Nucleus",
    "Row",
    "RowSession",
    "TargetScorer",
    "TorchNucleus",
    "TorchRow",
    "in_nucleus",
]

#: slack for float rounding between batch shapes, in log-prob, for greedy answers
TOLERANCE = 1e-4
#: how far past top-p (in probability mass before the token) a sampled token is still taken to
#: be one the engine could have drawn. Measured (BENCHMARKS.md, "The target through its
#: engine"): between float32 vLLM and float32 transformers the mass before a drawn token differs
#: by ~1e-5; between bfloat16 and float32 numbers of the same model, the largest gap near the
#: boundary is 0.001-0.059 per answer, median 0.01 (14 answers). 0.01 covers the median; a
#: scorer that is not the sampling engine can be further off (score through its server).
NUCLEUS_MARGIN = 0.01


def in_nucleus(mass_before: float, top_p: float) -> bool:
    """Whether a token with ``mass_before`` of the tempered mass above it could have been drawn
    under top-p ``top_p`` (vLLM's and transformers' rule: the nucleus keeps a token while the
    mass strictly more probable than it is below top-p), within ``NUCLEUS_MARGIN``."""
    return mass_before < top_p + NUCLEUS_MARGIN


class Nucleus(Protocol):
    def q(self, token: int) -> float:
        """The token's log-probability under the sampling distribution; -inf outside the
        nucleus."""
        ...

    def unknown_outside(self) -> bool:
        """Whether every token its row does not know lies outside the nucleus (the known ones
        more probable than any of them already fill it), so none is worth asking for."""
        ...

    def lp_reaching(self, q: float) -> float:
        """The least log p (temperature 1) at which a token's ``q`` could exceed ``q``: a token
        the row does not know, whose log p is at most the row's ceiling, is not worth asking
        for where the ceiling is at most this (-inf where that cannot be said)."""
        ...


class Row(Protocol):
    """The model's distribution over the token at one position."""

    def lp(self, token: int) -> float:
        """log p(token), normalised over the vocabulary, at temperature 1."""
        ...

    def top(self) -> float:
        """The largest log p at this position."""
        ...

    def topk(self, k: int) -> list[int]:
        """The ``k`` most probable ids (fewer where fewer are known), most probable first."""
        ...

    def need(self, tokens: Sequence[int]) -> None:
        """Say that ``lp`` will be asked for these tokens (a server row fetches them together)."""
        ...

    def has(self, token: int) -> bool:
        """Whether ``lp(token)`` is had without asking (always, in this process)."""
        ...

    def ceiling(self) -> float:
        """The largest log p a token it does not ``has`` can have (a server row: the least of
        the top K it gave)."""
        ...

    def nucleus(self, decoding: Decoding) -> Nucleus: ...


#: ``go_on(n, rows)``: whether path ``n`` of a ``peek_many`` is worth its next row
GoOn = Callable[[int, Sequence["Row"]], bool]


class RowSession(Protocol):
    """One sequence under the model for the repair walk (``Scorer.session``,
    ``ServerScorer.session``): a row per position from ``first`` on."""

    ids: list[int]
    first: int
    forwards: int
    tokens_forwarded: int
    #: log p(ids[j] | ids[:j]) for j in 1..first-1
    prefix_logprobs: list[float]

    def row(self, j: int) -> Row: ...

    def possible(self, j: int, decoding: Decoding, greedy: bool) -> list[bool]:
        """For each position from ``j`` to the end: could ``decoding`` have produced its id?"""
        ...

    def replace_from(self, j: int, tail: Sequence[int]) -> None:
        """Set ``ids[j:] = tail`` and recompute what follows."""
        ...

    def peek_many(
        self, paths: Sequence[tuple[int, Sequence[int]]], go_on: GoOn | None = None
    ) -> Sequence[Sequence[Row]]:
        """Per path ``(j, path)`` put at position ``j``: the rows predicting ``path[1:]``. With
        ``go_on``, a session that asks step by step (a server) may stop a path early, after the
        rows for which ``go_on(n, rows)`` is False (the n-th path can no longer matter)."""
        ...

    def logprobs(self) -> list[float]:
        """log p(ids[j] | ids[:j]) for j from ``first`` to the end."""
        ...


class TargetScorer(Protocol):
    """The target model, in this process (``score.Scorer``) or behind its server
    (``generate.scoring.ServerScorer``)."""

    #: what the ledger keeps its scores under (the model's folder, or the server's URL and model)
    key: str
    #: samples repaired at once (1 in this process)
    concurrency: int

    def logprobs(self, seqs: Sequence[Sequence[int]]) -> list[list[float]]: ...

    def session(self, ids: Sequence[int], first: int) -> RowSession: ...


class TorchNucleus:
    """softmax(logits / T) cut to the top-p nucleus. Not renormalised: the nucleus holds at least
    ``top_p`` of the mass, so renormalising would add at most -log(top_p) per step (0.05 at 0.95),
    and skipping it saves a sort of the vocabulary."""

    def __init__(self, torch: Any, row: Any, decoding: Decoding) -> None:
        self.probs = torch.softmax(row / float(decoding.temperature or 1.0), dim=-1)
        self.top_p = decoding.top_p
        self._q: dict[int, float] = {}

    def q(self, token: int) -> float:
        if token not in self._q:
            p = self.probs[token]
            before = float((self.probs * (self.probs > p)).sum())
            inside = float(p) > 0 and in_nucleus(before, self.top_p)
            self._q[token] = math.log(float(p)) if inside else -math.inf
        return self._q[token]

    def unknown_outside(self) -> bool:
        return True  # a full row knows every token

    def lp_reaching(self, q: float) -> float:
        return -math.inf  # a full row knows every token: nothing is asked


class TorchRow:
    """A full logits row of a model run in this process."""

    def __init__(self, torch: Any, logits: Any) -> None:
        self.torch = torch
        self.logits = logits
        self._lp: Any = None

    def _lps(self) -> Any:
        if self._lp is None:
            self._lp = self.torch.log_softmax(self.logits, dim=-1)
        return self._lp

    def lp(self, token: int) -> float:
        return float(self._lps()[token])

    def top(self) -> float:
        return float(self._lps().max())

    def topk(self, k: int) -> list[int]:
        got: list[int] = self.torch.topk(
            self.logits, min(k, self.logits.shape[-1])
        ).indices.tolist()
        return got

    def need(self, tokens: Sequence[int]) -> None:
        return None

    def has(self, token: int) -> bool:
        return True

    def ceiling(self) -> float:
        return -math.inf  # every token is known

    def nucleus(self, decoding: Decoding) -> TorchNucleus:
        return TorchNucleus(self.torch, self.logits, decoding)


def possible_rows(
    torch: Any, rows: Any, ids: Sequence[int], decoding: Decoding, greedy: bool
) -> list[bool]:
    """For each full logits row (``rows[k]`` predicts ``ids[k]``): could the decoding have
    produced ``ids[k]``? Greedy: the arg-max within ``TOLERANCE``; sampled: inside the nucleus."""
    idx = torch.tensor(list(ids), dtype=torch.long, device=rows.device)
    if greedy:
        lp = torch.log_softmax(rows, dim=-1)
        ours = lp.gather(-1, idx[:, None])[:, 0]
        return [bool(x) for x in (ours >= lp.max(dim=-1).values - TOLERANCE).tolist()]
    probs = torch.softmax(rows / float(decoding.temperature or 1.0), dim=-1)
    ours = probs.gather(-1, idx[:, None])
    mass_before = (probs * (probs > ours)).sum(dim=-1)
    return [in_nucleus(float(x), decoding.top_p) for x in mass_before.tolist()]
