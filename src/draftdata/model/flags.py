"""What a teacher-forced pass says about a sample, without ground truth.

A token the target model gives a very low log-probability is one it would almost never have
produced: on a trained position, an answer token that is not the model's (an end marker replaced
by an ordinary token, the "chas" class of bug, or a wrong split); after a prompt control id, a token
the template would not have written there: the sign of a marker the template did not put there
(a control string in user text encoded as a control id). ``flags_of`` lists them; ``ScoreReport`` counts
them per dataset and token source.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import Flag, FlagKind, SampleScore

__all__ = ["DEFAULT_THRESHOLD", "Flag", "SampleScore", "ScoreReport", "flags_of"]

#: log-probability below which a token is flagged. On 160 SmolLM2 dev records the lowest generated
#: token (greedy, or sampled at T=0.8, top-p 0.95) scores -7.7 and an ordinary id in place of the
#: end marker at most -14.8 (benchmarks/score_floor.py, BENCHMARKS.md).
DEFAULT_THRESHOLD = -12.0
EXAMPLES = 5


def flags_of(
    ids: Sequence[int],
    loss_mask: Sequence[bool],
    logprobs: Sequence[float],
    control_ids: Collection[int],
    threshold: float,
) -> list[Flag]:
    """``logprobs[j - 1]`` is log p(ids[j] | ids[:j]). Flags: trained tokens below ``threshold``
    (``marker`` where the token is a control id, ``trained`` otherwise), and prompt tokens right
    after a control id that score below it. A control id's own score is
    no evidence (the end of a system prompt is hard to predict: -15.5 on SmolLM2's default one),
    but what follows a marker the template wrote is near certain (a newline, a role name)."""
    out: list[Flag] = []
    for j in range(1, len(ids)):
        lp = logprobs[j - 1]
        if loss_mask[j]:
            if lp < threshold:
                # a trained marker the model would not have written there: an end of turn
                # after an answer a server cut short, a close marker right after text where
                # the model writes whitespace first (a server stripped it)
                kind: FlagKind = "marker" if ids[j] in control_ids else "trained"
                out.append(Flag(j, ids[j], lp, kind))
        elif ids[j - 1] in control_ids and lp < threshold:
            out.append(Flag(j, ids[j], lp, "after_prompt_control"))
    return out


def score_of(
    sample_id: str,
    dataset: str,
    token_source: str,
    ids: Sequence[int],
    loss_mask: Sequence[bool],
    logprobs: Sequence[float],
    control_ids: Collection[int],
    threshold: float,
    repairs: int = 0,
) -> SampleScore:
    trained = [logprobs[j - 1] for j in range(1, len(ids)) if loss_mask[j]]
    return SampleScore(
        sample_id,
        dataset,
        token_source,
        len(trained),
        float(sum(trained)),
        float(min(trained)) if trained else 0.0,
        tuple(flags_of(ids, loss_mask, logprobs, control_ids, threshold)),
        repairs,
    )


@dataclass
class ScoreReport:
    """Scores added up per dataset and token source, with a few flagged tokens shown."""

    threshold: float
    groups: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, s: SampleScore, show: Any = None) -> None:
        g = self.groups.setdefault(
            (s.dataset, s.token_source),
            {
                "samples": 0,
                "tokens": 0,
                "sum_logprob": 0.0,
                "min_logprob": math.inf,
                "flagged_tokens": 0,
                "flagged_samples": 0,
                "flags_by_kind": {},
                "repairs": 0,
            },
        )
        g["samples"] += 1
        g["tokens"] += s.trained
        g["sum_logprob"] += s.sum_logprob
        if s.trained:
            g["min_logprob"] = min(g["min_logprob"], s.min_logprob)
        g["flagged_tokens"] += len(s.flags)
        g["flagged_samples"] += bool(s.flags)
        g["repairs"] += s.repairs
        for f in s.flags:
            g["flags_by_kind"][f.kind] = g["flags_by_kind"].get(f.kind, 0) + 1
            if len(self.examples) < EXAMPLES * 4:
                ex = {"sample": s.sample_id, "dataset": s.dataset, **f.__dict__}
                if show is not None:
                    ex["context"] = show(f.position)
                self.examples.append(ex)

    def to_json(self) -> dict[str, Any]:
        rows = []
        for (dataset, source), g in sorted(self.groups.items()):
            rows.append(
                {
                    "dataset": dataset,
                    "token_source": source,
                    **{k: v for k, v in g.items() if k not in ("sum_logprob", "min_logprob")},
                    "mean_logprob": round(g["sum_logprob"] / g["tokens"], 6) if g["tokens"] else 0,
                    "min_logprob": round(g["min_logprob"], 4)
                    if math.isfinite(g["min_logprob"])
                    else None,
                }
            )
        return {
            "threshold": self.threshold,
            "samples": sum(r["samples"] for r in rows),
            "flagged_samples": sum(r["flagged_samples"] for r in rows),
            "flagged_tokens": sum(r["flagged_tokens"] for r in rows),
            "repairs": sum(r["repairs"] for r in rows),
            "groups": rows,
            "examples": self.examples,
        }
