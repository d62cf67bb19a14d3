"""The model stage over a run's ledger: score every sample not yet scored by this model, repair
the reconstructed ones where asked, and keep both in the ledger (resumable: a rerun goes on where
it stopped). A repaired sample replaces the reconstructed one, with ``token_source = repaired``;
its repairs are kept beside its score."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Manifest
from ..files import write_text
from ..records import Decoding, Sample
from ..session import Run
from ..store.ledger import Ledger
from ..tokens.target import Target
from .flags import ScoreReport
from .rows import TargetScorer
from .sample_scores import CHUNK, Scored, score_samples

__all__ = [
    "DatasetDecoding",
    "datasets_of",
    "run_report",
    "score_run",
    "score_run_to_file",
    "unscored",
]


@dataclass(frozen=True)
class DatasetDecoding:
    name: str
    decoding: Decoding


#: a loaded scorer, or what loads one: (the model's key, a function that loads it), so a run with
#: nothing left to score never loads the model
ScorerSource = TargetScorer | tuple[str, Callable[[], TargetScorer]]


def _key(scorer: ScorerSource) -> str:
    return scorer[0] if isinstance(scorer, tuple) else scorer.key


def score_run(
    ledger: Ledger,
    scorer: ScorerSource,
    target: Target,
    datasets: Sequence[DatasetDecoding],
    *,
    threshold: float,
    repair: bool,
    on_sample: Callable[[object], None] | None = None,
    unscorable: Counter[str] | None = None,
) -> tuple[int, int]:
    """Score (and repair) what is not scored yet; returns (samples scored now, samples repaired).
    ``unscorable``: samples the model's server refused, counted by refusal and left unscored
    (a later run asks again); None: a refusal ends it."""
    model = _key(scorer)
    scored = repaired = 0
    for d in datasets:
        done = ledger.scores.scored(d.name, model)
        # keys first: the samples are read one by one while repaired ones are written back
        keys = [k for k in ledger.samples.keys(d.name) if k not in done]
        if not keys:
            continue
        if isinstance(scorer, tuple):
            scorer = scorer[1]()  # the first dataset with something to score loads the model
        todo = ledger.samples.of_keys(keys)
        batch: list[Scored] = []
        dec = d.decoding

        def decoding_of(_s: Sample, dec: Decoding = dec) -> Decoding:
            return dec

        for r in score_samples(
            scorer,
            target,
            todo,
            threshold=threshold,
            repair=repair,
            decoding_of=decoding_of,
            unscorable=unscorable,
        ):
            batch.append(r)
            if on_sample is not None:
                on_sample(r)
            if len(batch) >= CHUNK:
                repaired += _keep(ledger, model, threshold, batch)
                scored += len(batch)
                batch = []
        repaired += _keep(ledger, model, threshold, batch)
        scored += len(batch)
    return scored, repaired


def _keep(ledger: Ledger, model: str, threshold: float, batch: list[Scored]) -> int:
    n = 0
    with ledger.tx():
        for r in batch:
            key = r.sample.key
            if key is None:
                continue
            if r.changed:
                ledger.samples.put(key, r.sample)
                n += 1
            ledger.scores.put(key, model, threshold, r.score, r.repairs)
    return n


def unscored(ledger: Ledger, scorer: ScorerSource, datasets: Sequence[str]) -> int:
    """How many samples of ``datasets`` the scorer's model has not scored yet."""
    n, model = 0, _key(scorer)
    for name in datasets:
        done = ledger.scores.scored(name, model)
        n += sum(k not in done for k in ledger.samples.keys(name))
    return n


def run_report(ledger: Ledger, model: str | None = None) -> ScoreReport | None:
    """The stored scores added up per dataset and token source (``None`` when there are none)."""
    rep: ScoreReport | None = None
    for stored in ledger.scores.all():
        if model is not None and stored.model != model:
            continue
        if rep is None:
            rep = ScoreReport(stored.threshold)
        rep.add(stored.score)
    return rep


def datasets_of(m: Manifest) -> list[DatasetDecoding]:
    """Each dataset of a run with the decoding its answers were made with."""
    return [DatasetDecoding(d.name, d.sampling.decoding) for d in m.datasets]


def score_run_to_file(
    ledger: Ledger,
    scorer: ScorerSource,
    target: Target,
    m: Manifest,
    *,
    threshold: float,
    repair: bool,
    out: Path,
    extra: dict[str, Any],
    on_sample: Callable[[object], None] | None = None,
) -> dict[str, Any]:
    """``score_run`` over every dataset of ``m``, then the stored scores added up, written to
    ``out`` (RUN/scores.json) with ``extra`` and returned."""
    t0 = time.monotonic()
    tokens = 0

    def counted(r: object) -> None:
        nonlocal tokens
        if isinstance(r, Scored):
            tokens += len(r.sample.input_ids)
        if on_sample is not None:
            on_sample(r)

    refused: Counter[str] = Counter()
    scored, repaired = score_run(
        ledger,
        scorer,
        target,
        datasets_of(m),
        threshold=threshold,
        repair=repair,
        on_sample=counted,
        unscorable=refused,
    )
    seconds = time.monotonic() - t0
    rep = run_report(ledger, _key(scorer))
    doc: dict[str, Any] = rep.to_json() if rep is not None else {"samples": 0, "groups": []}
    doc.update(extra)
    doc.update(
        {
            "scored_now": scored,
            "repaired_now": repaired,
            # samples the model's server refused to score (left unscored, asked again later)
            "unscorable_now": dict(refused),
            "seconds": round(seconds, 2),
            # the rate `plan` prices a local model's next model stage at
            "tokens_now": tokens,
            **({"tokens_per_s": round(tokens / seconds, 1)} if tokens and seconds > 0 else {}),
        }
    )
    write_text(out, json.dumps(doc, indent=2) + "\n")  # atomic: a reader never sees half of it
    return doc


def score_stage(
    run: Run,
    target: Target,
    scorer: ScorerSource,
    *,
    threshold: float,
    repair: bool,
    extra: dict[str, Any],
    progress: Callable[[int], Callable[[object], None] | None] | None = None,
) -> dict[str, Any]:
    """The model stage of a run opened to write: every sample not yet scored by this model
    scored (and the reconstructed ones repaired where ``repair``), RUN/scores.json written and
    returned. ``progress``: given how many samples are left, what each one scored calls (a
    progress line). ``run``'s model stage and ``draftdata score RUN`` both call it."""
    m, ledger = run.manifest, run.ledger
    tick = None
    if progress is not None:
        tick = progress(unscored(ledger, scorer, [d.name for d in m.datasets]))
    return score_run_to_file(
        ledger,
        scorer,
        target,
        m,
        threshold=threshold,
        repair=repair,
        out=m.output_dir / "scores.json",
        extra=extra,
        on_sample=tick,
    )
