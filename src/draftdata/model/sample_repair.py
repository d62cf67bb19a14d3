"""The target model's repair wired to the rest of draftdata: the repairer ``validate`` and the
run's model stage call for each reconstructed sample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..measure.repairing import Repaired, Repairer
from ..measure.validate import ValidationReport, validate
from ..records import Decoding, GroundTruth, Sample
from ..tokens.target import Target
from .repair_walk import RepairResult, repair_response
from .rows import TargetScorer

__all__ = ["repair_sample", "sample_repairer", "validate_repaired"]


def repair_sample(
    scorer: TargetScorer, target: Target, sample: Sample, decoding: Decoding
) -> RepairResult:
    """Repair one reconstructed sample's answer; the rest of a run is encoded as ``target``
    encodes it (open-ended for a truncated answer's last text, its split preferences)."""
    prompt = sample.input_ids[: sample.prompt_len]
    return repair_response(
        scorer,
        target.tokenizer,
        prompt,
        sample.response_ids,
        sample.finish_reason,
        decoding,
        target.piece_ids,
    )


def sample_repairer(scorer: TargetScorer, target: Target) -> Repairer:
    def run(sample: Sample, decoding: Decoding) -> Repaired:
        r = repair_sample(scorer, target, sample, decoding)
        return Repaired(r.response, len(r.repairs), r.tokens_forwarded, tuple(r.bets))

    return run


def validate_repaired(
    target: Target,
    records: list[GroundTruth],
    scorer: TargetScorer | None,
    *,
    on_result: Callable[[Any], None] | None = None,
    repair_with: Target | None = None,
) -> ValidationReport:
    """``measure.validate`` over ``records``, each reconstructed answer repaired by the target
    model first where a ``scorer`` is given (a server repairs several at once, within its
    concurrency): what ``draftdata validate --repair-with`` and a run's gate both measure.
    ``repair_with``: the target the repair encodes the rest of an answer as (None: ``target``;
    a run's cross-validation measures with preferences learned on the other half and repairs
    with the run's own)."""
    repairer = None
    if scorer is not None:
        repairer = sample_repairer(scorer, repair_with or target)
    return validate(
        target,
        records,
        repairer=repairer,
        on_result=on_result,
        concurrency=getattr(scorer, "concurrency", 1) if repairer is not None else 1,
    )
