"""The model stage: score every sample with the target model and, where asked, repair the
reconstructed ones. Engine and logprob samples are scored, never changed.

Samples are taken in chunks: the ones only scored go through one batched forward pass per chunk
(``Scorer.logprobs``; through a server, concurrent requests); a repaired one gets its own pass
with a KV cache (``model.repair_walk``; through a server, its own requests, the chunk's repairs
concurrently), and its score comes from that same pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice

from ..errors import DraftdataError
from ..measure.repairing import refusal_key
from ..records import Decoding, Sample
from ..tokens.counts import after_repair
from ..tokens.target import Target
from .flags import SampleScore, score_of
from .repair_walk import Repair, RepairResult
from .rows import TargetScorer
from .sample_repair import repair_sample

__all__ = ["Scored", "score_samples"]

#: samples scored together (one batched pass, then their results are handed on)
CHUNK = 16


@dataclass(frozen=True)
class Scored:
    sample: Sample
    score: SampleScore
    repairs: tuple[Repair, ...] = ()
    #: the sample before repair (the same object when nothing changed)
    original: Sample | None = None

    @property
    def changed(self) -> bool:
        return bool(self.repairs)


def _repairable(s: Sample) -> bool:
    """Reconstructed, with the whole answer after the prompt trained (one answer per sample)."""
    return (
        s.token_source == "reconstructed"
        and len(s.input_ids) > s.prompt_len > 0
        and not any(s.loss_mask[: s.prompt_len])
        and all(s.loss_mask[s.prompt_len :])
    )


def score_samples(
    scorer: TargetScorer,
    target: Target,
    samples: Iterable[Sample],
    *,
    threshold: float,
    repair: bool = False,
    decoding_of: Callable[[Sample], Decoding] = lambda _s: Decoding(),
    unscorable: Counter[str] | None = None,
) -> Iterator[Scored]:
    """Score (and with ``repair``, repair) each sample, in order. ``unscorable``: a sample the
    model cannot score (its server refused it) is passed over and counted there by the
    refusal, never ending the stage (None: the refusal is raised)."""
    control = target.tokenizer.control_ids
    it = iter(samples)
    while chunk := list(islice(it, CHUNK)):
        fix = [repair and _repairable(s) for s in chunk]
        plain = [s for s, f in zip(chunk, fix, strict=True) if not f]
        lps = iter(_logprobs(scorer, plain, unscorable))
        todo = [s for s, f in zip(chunk, fix, strict=True) if f]

        def one(s: Sample) -> RepairResult | None:
            try:
                return repair_sample(scorer, target, s, decoding_of(s))
            except DraftdataError as e:
                if unscorable is None:
                    raise
                unscorable[refusal_key(str(e))] += 1
                return None

        # a server repairs the chunk's samples concurrently (its requests stay within its
        # concurrency); this process repairs them one by one
        if scorer.concurrency > 1 and len(todo) > 1:
            with ThreadPoolExecutor(min(scorer.concurrency, len(todo))) as pool:
                done = iter(list(pool.map(one, todo)))
        else:
            done = (one(s) for s in todo)
        for s, f in zip(chunk, fix, strict=True):
            if not f:
                lp = next(lps)
                if lp is not None:
                    yield Scored(s, _score(s, lp, control, threshold), original=s)
                continue
            r = next(done)
            if r is None:
                continue  # refused by the model's server: counted, left unscored
            new = s
            if r.repairs:
                ids = s.input_ids[: s.prompt_len] + r.response
                new = replace(
                    s,
                    input_ids=ids,
                    loss_mask=[False] * s.prompt_len + [True] * len(r.response),
                    token_source="repaired",
                    warnings=after_repair(s.warnings, len(r.response) - len(s.response_ids)),
                )
            yield Scored(
                new,
                _score(new, r.prompt_logprobs + r.logprobs, control, threshold, len(r.repairs)),
                tuple(r.repairs),
                s,
            )


def _logprobs(
    scorer: TargetScorer, plain: Sequence[Sample], unscorable: Counter[str] | None
) -> list[list[float] | None]:
    """The log-probabilities of ``plain`` in one batch; where the server refuses it, each on
    its own, a refused one None (counted in ``unscorable``)."""
    if not plain:
        return []
    try:
        return list(scorer.logprobs([s.input_ids for s in plain]))
    except DraftdataError:
        if unscorable is None:
            raise
    out: list[list[float] | None] = []
    for s in plain:
        try:
            out.append(scorer.logprobs([s.input_ids])[0])
        except DraftdataError as e:
            unscorable[refusal_key(str(e))] += 1
            out.append(None)
    return out


def _score(
    s: Sample,
    logprobs: Sequence[float],
    control: frozenset[int],
    threshold: float,
    repairs: int = 0,
) -> SampleScore:
    return score_of(
        s.id or (s.key.sample_id if s.key else ""),
        s.dataset,
        s.token_source,
        s.input_ids,
        s.loss_mask,
        logprobs,
        control,
        threshold,
        repairs,
    )
