"""What a drafter's acceptance was measured to be: the spec-decode counts of one dataset (read
from a serving engine's own counters, or simulated from the data), and a measured drafter's
results per dataset and overall, as ``draftdata evaluate`` writes them (``--json`` and
``RUN/acceptance/*.json``, which the report reads)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

#: the folder of a run that holds its measured drafters (one JSON file each)
ACCEPTANCE_DIR = "acceptance"


def drafter_name(path: str | None) -> str:
    """A drafter's short name: its folder's, with the parent's where the folder is a training
    checkpoint's number (speculators writes ``SAVE/<epoch>/``)."""
    if not path:
        return ""
    parts = [p for p in str(path).rstrip("/").split("/") if p]
    if len(parts) >= 2 and parts[-1].isdigit():
        return f"{parts[-2]}/{parts[-1]}"
    return parts[-1] if parts else ""


@dataclass(frozen=True)
class SpecCounts:
    """Speculative decoding's own counts over a set of requests (vLLM's ``spec_decode_*``
    counters): draft steps, tokens drafted, tokens accepted, and accepted tokens by position in
    the draft (position 0 is the first drafted token)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    @property
    def al(self) -> float:
        """Acceptance length: tokens per target forward, the bonus token included: 1 + accepted
        tokens per draft step (vLLM's "Mean acceptance length"). NaN with no draft step."""
        return 1.0 + self.accepted / self.drafts if self.drafts else math.nan

    @property
    def by_position(self) -> tuple[float, ...]:
        """The share of draft steps whose token at each position was accepted."""
        if not self.drafts:
            return tuple(math.nan for _ in self.accepted_per_pos)
        return tuple(n / self.drafts for n in self.accepted_per_pos)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else math.nan

    def __add__(self, other: SpecCounts) -> SpecCounts:
        k = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = (*self.accepted_per_pos, *([0] * (k - len(self.accepted_per_pos))))
        b = (*other.accepted_per_pos, *([0] * (k - len(other.accepted_per_pos))))
        return SpecCounts(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            tuple(x + y for x, y in zip(a, b, strict=True)),
        )

    def __sub__(self, other: SpecCounts) -> SpecCounts:
        k = len(self.accepted_per_pos)
        b = (*other.accepted_per_pos, *([0] * (k - len(other.accepted_per_pos))))
        return SpecCounts(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            tuple(x - y for x, y in zip(self.accepted_per_pos, b, strict=True)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "accepted_per_pos": list(self.accepted_per_pos),
            "al": _finite(self.al),
            "by_position": [_finite(x) for x in self.by_position],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SpecCounts:
        return cls(
            int(d["drafts"]),
            int(d["draft_tokens"]),
            int(d["accepted"]),
            tuple(int(x) for x in d.get("accepted_per_pos", ())),
        )


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


@dataclass(frozen=True)
class DatasetAcceptance:
    """One dataset's held-out prompts through the engine: the engine's counts (None: the server
    drafts nothing), the completion tokens and seconds, tokens/s beside the same requests to the
    server without a drafter (None: not measured), and the counts simulated in process over the
    same answers (None: not simulated)."""

    dataset: str
    prompts: int
    completion_tokens: int = 0
    wall_s: float = 0.0
    engine: SpecCounts | None = None
    baseline_tokens_per_s: float | None = None
    simulated: SpecCounts | None = None
    #: answers the simulation could not score (why -> count)
    unsimulated: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def speedup(self) -> float | None:
        if not self.baseline_tokens_per_s or math.isnan(self.tokens_per_s):
            return None
        return self.tokens_per_s / self.baseline_tokens_per_s

    @property
    def al_difference(self) -> float | None:
        """Simulated AL less the engine's (None where either is missing)."""
        if self.engine is None or self.simulated is None:
            return None
        d = self.simulated.al - self.engine.al
        return None if math.isnan(d) else d

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "prompts": self.prompts,
            "completion_tokens": self.completion_tokens,
            "wall_s": round(self.wall_s, 3),
            "tokens_per_s": _finite(self.tokens_per_s),
            "baseline_tokens_per_s": self.baseline_tokens_per_s,
            "speedup": self.speedup,
            "engine": self.engine.to_json() if self.engine is not None else None,
            "simulated": self.simulated.to_json() if self.simulated is not None else None,
            "al_difference": self.al_difference,
            "unsimulated": dict(self.unsimulated),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DatasetAcceptance:
        eng, sim = d.get("engine"), d.get("simulated")
        return cls(
            str(d["dataset"]),
            int(d["prompts"]),
            int(d.get("completion_tokens", 0)),
            float(d.get("wall_s", 0.0)),
            SpecCounts.from_json(eng) if eng else None,
            d.get("baseline_tokens_per_s"),
            SpecCounts.from_json(sim) if sim else None,
            {str(k): int(v) for k, v in (d.get("unsimulated") or {}).items()},
        )


def _sum(a: SpecCounts | None, b: SpecCounts | None) -> SpecCounts | None:
    if a is None:
        return b
    return a if b is None else a + b


def overall(rows: tuple[DatasetAcceptance, ...]) -> DatasetAcceptance:
    """Every dataset's requests as one: counts and tokens summed, the baseline's tokens/s
    weighted by each dataset's tokens."""
    total = DatasetAcceptance("all", 0)
    base_s = 0.0
    for r in rows:
        total = replace(
            total,
            prompts=total.prompts + r.prompts,
            completion_tokens=total.completion_tokens + r.completion_tokens,
            wall_s=total.wall_s + r.wall_s,
            engine=_sum(total.engine, r.engine),
            simulated=_sum(total.simulated, r.simulated),
            unsimulated={
                k: total.unsimulated.get(k, 0) + r.unsimulated.get(k, 0)
                for k in {*total.unsimulated, *r.unsimulated}
            },
        )
        if r.baseline_tokens_per_s:
            base_s += r.completion_tokens / r.baseline_tokens_per_s
    if base_s > 0 and all(r.baseline_tokens_per_s for r in rows):
        total = replace(total, baseline_tokens_per_s=round(total.completion_tokens / base_s, 3))
    return total


@dataclass(frozen=True)
class Acceptance:
    """A drafter measured: what drafts (``method``, its folder), K, how requests were asked, the
    engine, and the results per dataset."""

    method: str
    k: int
    drafter: str | None
    engine: str
    temperature: float
    max_tokens: int
    datasets: tuple[DatasetAcceptance, ...]
    created_at: str = ""
    #: the largest simulated-minus-engine AL difference the measure accepts as numerics
    tolerance: float | None = None

    @property
    def label(self) -> str:
        return f"{self.method} K={self.k}" + (
            f" {drafter_name(self.drafter)}" if self.drafter else ""
        )

    @property
    def total(self) -> DatasetAcceptance:
        return overall(self.datasets)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "k": self.k,
            "drafter": self.drafter,
            "engine": self.engine,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "created_at": self.created_at,
            "tolerance": self.tolerance,
            "datasets": [d.to_json() for d in self.datasets],
            "overall": self.total.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Acceptance:
        return cls(
            str(d["method"]),
            int(d["k"]),
            d.get("drafter"),
            str(d.get("engine", "")),
            float(d.get("temperature", 0.0)),
            int(d.get("max_tokens", 0)),
            tuple(DatasetAcceptance.from_json(x) for x in d.get("datasets", [])),
            str(d.get("created_at", "")),
            d.get("tolerance"),
        )
