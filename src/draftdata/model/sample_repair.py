"""The target model's repair wired to the rest of draftdata: the repairer ``validate`` and the
run's model stage call for each reconstructed sample."""

from __future__ import annotations

from ..formats.segments import TextIds, piece_ids
from ..measure.repairing import Repaired, Repairer
from ..records import Decoding, Sample
from ..tokenizers import Tokenizer
from .repair_walk import RepairResult, repair_response
from .rows import TargetScorer

__all__ = ["repair_sample", "sample_repairer"]


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
