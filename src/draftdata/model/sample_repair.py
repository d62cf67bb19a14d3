"""The target model's repair wired to the rest of draftdata: the repairer ``validate`` and the
run's model stage call for each reconstructed sample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ..formats import BoundFormat
from ..formats.segments import TextIds, piece_ids
from ..measure.repairing import Repaired, Repairer
from ..measure.validate import ValidationReport, validate
from ..records import Decoding, GroundTruth, Sample
from ..tokenizers import Tokenizer
from .repair_walk import RepairResult, repair_response
from .rows import TargetScorer

__all__ = ["repair_sample", "sample_repairer", "validate_repaired"]


def repair_sample(
    scorer: TargetScorer,
    tok: Tokenizer,
    sample: Sample,
    decoding: Decoding,
    text_ids: TextIds | None = None,
) -> RepairResult:
    """Repair one reconstructed sample's answer; the rest of a run is encoded as reconstruction
    encodes it (open-ended for a truncated answer's last text, learned preferences if given)."""

    def encode_rest(text: str, open_end: bool) -> list[int]:
        return piece_ids(tok, text, open_end, text_ids)

    prompt = sample.input_ids[: sample.prompt_len]
    return repair_response(
        scorer, tok, prompt, sample.response_ids, sample.finish_reason, decoding, encode_rest
    )


def sample_repairer(
    scorer: TargetScorer, tok: Tokenizer, text_ids: TextIds | None = None
) -> Repairer:
    def run(sample: Sample, decoding: Decoding) -> Repaired:
        r = repair_sample(scorer, tok, sample, decoding, text_ids)
        return Repaired(r.response, len(r.repairs), r.tokens_forwarded, tuple(r.bets))

    return run


def validate_repaired(
    bound: BoundFormat,
    records: list[GroundTruth],
    scorer: TargetScorer | None,
    *,
    text_ids: TextIds | None,
    thinking: bool | None,
    on_result: Callable[[Any], None] | None = None,
    repair_text_ids: TextIds | Literal["measured"] | None = "measured",
) -> ValidationReport:
    """``measure.validate`` over ``records``, each reconstructed answer repaired by the target
    model first where a ``scorer`` is given (a server repairs several at once, within its
    concurrency): what ``draftdata validate --repair-with`` and a run's gate both measure.
    ``repair_text_ids``: the split preferences the repair encodes the rest of an answer with
    ("measured": ``text_ids``; a run's cross-validation measures with preferences learned on
    the other half and repairs with the run's own)."""
    repairer = None
    if scorer is not None:
        rest = text_ids if repair_text_ids == "measured" else repair_text_ids
        repairer = sample_repairer(scorer, bound.tokenizer, rest)
    return validate(
        bound,
        records,
        text_ids=text_ids,
        thinking=thinking,
        repairer=repairer,
        on_result=on_result,
        concurrency=getattr(scorer, "concurrency", 1) if repairer is not None else 1,
    )
