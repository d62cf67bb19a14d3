"""What one stage of a run leaves in the ledger for another, beside the run's answers and
samples: the typed records of the ledger's ``meta`` table. ``store.meta`` declares the key of
each and is its one serialiser, both ways; the stage that makes one converts its own object to
it (``measure.gate.Gate.record``, ``measure.contamination.Tally.record``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict


class DatasetSettings(TypedDict, total=False):
    """What makes a dataset's samples mean what they mean (``session.settings.settings_of``),
    kept per dataset: a rerun that changes any of it is refused. A ledger of an older draftdata
    holds fewer keys (the ones it did not record are taken as they are now)."""

    tokenizer_sha256: str
    format: str
    thinking: bool | None
    backend_kind: str
    backend_model: str | None
    sampling: dict[str, Any]
    extra_body: dict[str, Any] | None
    server: str | None
    token_ids: str | None
    samples_per_prompt: int
    turns: str
    reader: str
    columns: dict[str, str]
    tools_prompt: str
    system: str | None
    source_sha256: str | None


@dataclass(frozen=True)
class GateRecord:
    """The gate's verdict as the run recorded it (``measure.gate.Gate``'s fields). ``gated``,
    ``unmeasured`` and ``evidence`` are None in a record of a draftdata that did not write
    them yet, and stay out of it when it is written again."""

    min_exact: float
    exact_match_rate: float | None
    passed: bool
    forced: bool
    reason: str
    gated: bool | None = None
    unmeasured: str | None = None
    evidence: str | None = None


@dataclass(frozen=True)
class FlaggedPrompt:
    """A prompt dropped as contaminated: the evaluation prompt it holds, and how it matched."""

    prompt_id: str
    eval_set: str
    eval_id: str
    score: float
    rule: Literal["ngram", "exact"]


@dataclass(frozen=True)
class Contamination:
    """A dataset's ``[run] decontaminate`` tally when it was read: prompts checked, those
    flagged (in all and by evaluation set), and the first flagged ones."""

    checked: int
    flagged: int
    by_set: dict[str, int]
    first: tuple[FlaggedPrompt, ...] = ()
