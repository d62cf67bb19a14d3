"""Reconstruction measured against ground truth: exact-match, token accuracy, where and why it
diverges. This is the gate that protects paid API runs.

A view whose server lost text for good carries a ``lossy:*`` label, and its ids there are the
format's guess. With ground truth at hand the guess is checked like any other id: a labelled
view whose ids equal the truth counts as equal (the guess held), and the report says, per
label, how many views carried it and how many held. Where nothing was measured, a rate is None
(null in JSON), never 0.0."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from difflib import SequenceMatcher
from itertools import islice
from typing import Any, Literal

from ..errors import DraftdataError, ReconstructError
from ..formats import BoundFormat, derive_view
from ..records import ApiView, GroundTruth, Mismatch, Sample, ValidationResult
from ..records.counting import warning_kind
from ..tokens.prefs import Pair
from ..tokens.reconstruct import WINDOW, Item
from ..tokens.response import answer_segments
from ..tokens.target import Target
from ..version import __version__
from .repairing import Measured, Repairer, repaired

CATEGORIES = (
    "end_of_turn",
    "think_markers",
    "marker_whitespace",
    "tool_call",
    "whitespace_split",
    "bpe_split",
    "invalid_utf8",
    "truncation",
    "prompt_template",
    "text_mismatch",
)
EXAMPLES = 5


def rate(k: int, n: int) -> float | None:
    """``k / n`` rounded for the report; None where nothing was measured (``n`` 0)."""
    return round(k / n, 6) if n else None


@dataclass
class RepairTally:
    """What the model's repair changed, record by record, against plain reconstruction."""

    fixed: int = 0
    broken: int = 0
    unchanged_exact: int = 0
    unchanged_wrong: int = 0
    samples_repaired: int = 0
    repairs: int = 0
    before_exact: int = 0
    before_token_matches: int = 0
    before_token_total: int = 0
    tokens: int = 0
    tokens_forwarded: int = 0
    broken_ids: list[str] = field(default_factory=list)
    #: switches made where ours could have been drawn too, and how many of them are expected to
    #: be wrong if the numbers are the sampling engine's (each is wrong with 1 / (1 + e^margin))
    bets: int = 0
    bets_expected_wrong: float = 0.0
    #: samples the model could not repair (its server refused them), by the refusal's start
    unrepaired: Counter[str] = field(default_factory=Counter)

    def bet(self, margins: Sequence[float]) -> None:
        self.bets += len(margins)
        self.bets_expected_wrong += sum(1 / (1 + math.exp(min(m, 700.0))) for m in margins)

    def add(self, rid: str, before: ValidationResult, after: ValidationResult, n: int) -> None:
        self.before_exact += before.exact
        self.before_token_matches += before.token_matches
        self.before_token_total += before.token_total
        self.repairs += n
        self.samples_repaired += n > 0
        if before.exact and not after.exact:
            self.broken += 1
            self.broken_ids.append(rid)
        elif after.exact and not before.exact:
            self.fixed += 1
        elif after.exact:
            self.unchanged_exact += 1
        else:
            self.unchanged_wrong += 1

    def to_json(self, n: int) -> dict[str, Any]:
        return {
            "fixed": self.fixed,
            "broken": self.broken,
            "broken_ids": self.broken_ids[:EXAMPLES],
            "unchanged_exact": self.unchanged_exact,
            "unchanged_wrong": self.unchanged_wrong,
            "samples_repaired": self.samples_repaired,
            "repairs": self.repairs,
            "before": {
                "exact": self.before_exact,
                "exact_match_rate": rate(self.before_exact, n),
                "token_accuracy": rate(self.before_token_matches, self.before_token_total),
            },
            "tokens": self.tokens,
            "tokens_forwarded": self.tokens_forwarded,
            "bets": self.bets,
            "bets_expected_wrong": round(self.bets_expected_wrong, 3),
            "unrepaired": dict(self.unrepaired),
        }


@dataclass
class LabelTally:
    """One ``lossy:*`` label: the views that carried it, and those whose ids equal the truth
    all the same (the format's guess held)."""

    views: int = 0
    held: int = 0


@dataclass
class ValidationReport:
    n: int = 0
    #: views whose ids (prompt and response) equal the truth, labelled or not
    exact: int = 0
    #: views whose server lost something for good (a ``lossy:*`` warning)
    lossy: int = 0
    #: of those, the views whose ids equal the truth all the same
    lossy_held: int = 0
    labels: dict[str, LabelTally] = field(default_factory=dict)
    prompt_exact: int = 0
    token_matches: int = 0
    token_total: int = 0
    categories: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[Mismatch]] = field(default_factory=lambda: defaultdict(list))
    by_source: dict[str, dict[str, Any]] = field(default_factory=dict)
    token_sources: Counter[str] = field(default_factory=Counter)
    drops: Counter[str] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)
    meta: dict[str, Any] = field(default_factory=dict)
    by_decoding: dict[str, list[int]] = field(default_factory=dict)
    repair: RepairTally | None = None

    @property
    def exact_match_rate(self) -> float | None:
        """Ids equal to the truth over every view, a held guess counted equal (the gate's
        figure); None: no view measured."""
        return self.exact / self.n if self.n else None

    @property
    def lossless(self) -> int:
        """Views that kept everything (no ``lossy:*`` label)."""
        return self.n - self.lossy

    @property
    def lossless_exact(self) -> int:
        return self.exact - self.lossy_held

    @property
    def lossless_exact_match_rate(self) -> float | None:
        """Ids equal over the views that kept everything: reconstruction alone, no guess in
        it; None: no lossless view to measure."""
        return self.lossless_exact / self.lossless if self.lossless else None

    @property
    def token_accuracy(self) -> float | None:
        return self.token_matches / self.token_total if self.token_total else None

    def held_summary(self) -> str:
        """``think_whitespace held 40 of 40, ...``: each label's guess against the truth."""
        return ", ".join(
            f"{k.removeprefix('lossy:')} held {t.held} of {t.views}"
            for k, t in sorted(self.labels.items())
        )

    def add(self, r: ValidationResult) -> None:
        self.n += 1
        self.exact += r.exact
        if r.lossy:
            self.lossy += 1
            self.lossy_held += r.exact
        for label in r.lossy:
            tally = self.labels.setdefault(label, LabelTally())
            tally.views += 1
            tally.held += r.exact
        self.prompt_exact += r.prompt_exact
        self.token_matches += r.token_matches
        self.token_total += r.token_total
        self.token_sources[r.token_source] += 1
        src = self.by_source.setdefault(
            r.source,
            {"n": 0, "exact": 0, "token_matches": 0, "token_total": 0, "categories": Counter()},
        )
        src["n"] += 1
        src["exact"] += r.exact
        src["token_matches"] += r.token_matches
        src["token_total"] += r.token_total
        if r.category:
            self.categories[r.category] += 1
            src["categories"][r.category] += 1
            if r.example and len(self.examples[r.category]) < EXAMPLES:
                self.examples[r.category].append(r.example)

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "exact": self.exact,
            "exact_match_rate": rate(self.exact, self.n),
            "lossy": self.lossy,
            "lossy_held": self.lossy_held,
            "lossy_labels": {k: asdict(t) for k, t in sorted(self.labels.items())},
            "lossless": self.lossless,
            "lossless_exact": self.lossless_exact,
            "lossless_exact_match_rate": rate(self.lossless_exact, self.lossless),
            "token_accuracy": rate(self.token_matches, self.token_total),
            "prompt_exact_rate": rate(self.prompt_exact, self.n),
            "categories": dict(self.categories),
            "by_source": {
                s: {
                    "n": v["n"],
                    "exact": v["exact"],
                    "exact_match_rate": rate(v["exact"], v["n"]),
                    "token_accuracy": rate(v["token_matches"], v["token_total"]),
                    "categories": dict(v["categories"]),
                }
                for s, v in sorted(self.by_source.items())
            },
            "examples": {k: [asdict(e) for e in v] for k, v in self.examples.items()},
            "token_sources": dict(self.token_sources),
            "by_decoding": {
                k: {"n": n, "exact": e, "exact_match_rate": rate(e, n)}
                for k, (n, e) in sorted(self.by_decoding.items())
            },
            **({"repair": self.repair.to_json(self.n)} if self.repair is not None else {}),
            "drops": dict(self.drops),
            "warnings": dict(self.warnings),
            "draftdata_version": __version__,
            **self.meta,
        }


def _bytes(tok: Any, ids: Sequence[int]) -> bytes:
    return b"".join(tok.token_bytes(i) for i in ids)


def classify(
    bound: BoundFormat, truth: Sequence[int], recon: Sequence[int], finish: str
) -> tuple[str, int]:
    """Category and index of the first divergence between two response id lists."""
    k = next(
        (i for i, (a, b) in enumerate(zip(truth, recon, strict=False)) if a != b),
        min(len(truth), len(recon)),
    )
    tok, fmt = bound.tokenizer, bound.format
    t = truth[k] if k < len(truth) else None
    r = recon[k] if k < len(recon) else None
    end_text = fmt.markers[fmt.end_of_turn].text
    real_end = tok.control_by_text.get(end_text)
    end_ids = set(bound.stop_ids) | ({real_end.id} if real_end else set())
    names = {v: n for n, v in bound.ids.items()}
    think_ids = (
        {bound.ids.get(fmt.think.open), bound.ids.get(fmt.think.close)} if fmt.think else set()
    )
    if t in end_ids or r in end_ids:
        return "end_of_turn", k
    if t in think_ids or r in think_ids:
        return "think_markers", k
    if t in names or r in names or t in tok.control_ids or r in tok.control_ids:
        tool = any("tool" in names.get(x, "") for x in (t, r) if x is not None)
        return ("tool_call" if tool else "think_markers"), k
    near_marker = (k > 0 and truth[k - 1] in tok.control_ids) or any(
        x in tok.control_ids for x in truth[k : k + 3]
    )
    tb, rb = _bytes(tok, truth), _bytes(tok, recon)
    piece = tok.token_bytes(t) if t is not None else b""
    if near_marker and piece.strip() == b"":
        return "marker_whitespace", k
    if tb != rb:
        try:
            tb.decode("utf-8")
        except UnicodeDecodeError:
            return "invalid_utf8", k
        if finish == "length" and k >= len(truth) - 2:
            return "truncation", k
        return "text_mismatch", k
    if finish == "length" and k >= len(truth) - 2:
        return "truncation", k
    if piece.strip() == b"" or (r is not None and tok.token_bytes(r).strip() == b""):
        return "whitespace_split", k
    return "bpe_split", k


def _example(
    bound: BoundFormat,
    rid: str,
    truth: Sequence[int],
    recon: Sequence[int],
    k: int,
    where: Literal["prompt", "response"],
) -> Mismatch:
    tok = bound.tokenizer

    def show(ids: Sequence[int]) -> str:
        return " ".join(f"{i}:{tok.token_str(i)!r}" for i in ids[max(0, k - 3) : k + 4])

    return Mismatch(
        rid, where, k, show(truth), show(recon), tok.decode(truth[max(0, k - 6) : k + 6])
    )


def compare(
    bound: BoundFormat,
    rid: str,
    source: str,
    truth_prompt: Sequence[int],
    truth_output: Sequence[int],
    prompt_ids: Sequence[int],
    response: Sequence[int],
    finish: str,
    token_source: str,
) -> ValidationResult:
    prompt_exact = list(truth_prompt) == list(prompt_ids)
    response_exact = list(truth_output) == list(response)
    sm = SequenceMatcher(None, list(truth_output), list(response), autojunk=False)
    matches = sum(b.size for b in sm.get_matching_blocks())
    total = max(len(truth_output), len(response))
    category = first = None
    example = None
    if not prompt_exact:
        k = next(
            (i for i, (a, b) in enumerate(zip(truth_prompt, prompt_ids, strict=False)) if a != b),
            min(len(truth_prompt), len(prompt_ids)),
        )
        cat, _ = classify(bound, truth_prompt, prompt_ids, "stop")
        category = "end_of_turn" if cat == "end_of_turn" else "prompt_template"
        first = k
        example = _example(bound, rid, truth_prompt, prompt_ids, k, "prompt")
    elif not response_exact:
        category, first = classify(bound, truth_output, response, finish)
        example = _example(bound, rid, truth_output, response, first, "response")
    return ValidationResult(
        rid,
        source,
        prompt_exact and response_exact,
        prompt_exact,
        matches,
        total,
        category,
        first,
        token_source,
        example,
    )


def _measure(
    bound: BoundFormat,
    gt: GroundTruth,
    truth_prompt: Sequence[int],
    prompt_ids: Sequence[int],
    response: Sequence[int],
    source: str,
) -> ValidationResult:
    return compare(
        bound,
        gt.id,
        gt.source,
        truth_prompt,
        gt.output_ids,
        prompt_ids,
        response,
        gt.finish_reason,
        source,
    )


def _reconstructed(
    target: Target, records: Iterable[GroundTruth]
) -> Iterator[tuple[GroundTruth, Sample | DraftdataError]]:
    """Each record with its reconstruction from its text (or the error that stopped it), a
    window of records encoded in one batched call."""
    it = iter(records)
    while chunk := list(islice(it, WINDOW)):
        views: list[ApiView | DraftdataError] = []
        for gt in chunk:
            try:
                views.append(gt.view or derive_view(target.bound, gt.output_ids, gt.finish_reason))
            except DraftdataError as e:
                views.append(e)
        items = [
            Item(gt.messages, v, gt.tools, gt.id)
            for gt, v in zip(chunk, views, strict=True)
            if not isinstance(v, DraftdataError)
        ]
        made = iter(target.reconstruct_many(items))
        for gt, v in zip(chunk, views, strict=True):
            yield gt, v if isinstance(v, DraftdataError) else next(made)


def validate(
    target: Target,
    records: Iterable[GroundTruth],
    *,
    on_result: Callable[[ValidationResult], None] | None = None,
    repairer: Repairer | None = None,
    concurrency: int = 1,
) -> ValidationReport:
    """Reconstruct each record from its text (the server's view, or the view derived from its
    ids) as ``target`` does, its split preferences and thinking option included, and compare the ids with the record's own, prompt and response. With ``repairer``
    each reconstructed sample is repaired by the target model before it is compared, and the
    report also says what the repair fixed and broke; ``concurrency`` samples at once (a
    server's scorer)."""
    rep = ValidationReport()
    if repairer is not None:
        rep.repair = RepairTally()
    bound = target.bound
    measured = _measured(target, records, rep)
    for (gt, sample, result), fixed in repaired(repairer, measured, concurrency):
        if repairer is not None and rep.repair is not None:
            before = result
            n_repairs = 0
            if fixed is not None and fixed.failed:
                rep.repair.unrepaired[fixed.failed] += 1
                fixed = None  # measured as reconstruction left it
            if fixed is not None:  # engine and logprob ids are never changed
                response, n_repairs, forwarded, bets, _ = fixed
                rep.repair.tokens += len(sample.input_ids)
                rep.repair.tokens_forwarded += forwarded
                rep.repair.bet(bets)
                if n_repairs:
                    prompt_ids = sample.input_ids[: sample.prompt_len]
                    truth = gt.prompt_ids if gt.prompt_ids is not None else prompt_ids
                    new = _measure(bound, gt, truth, prompt_ids, response, "repaired")
                    result = replace(new, lossy=result.lossy)
            rep.repair.add(gt.id, before, result, n_repairs)
        rep.add(result)
        tally = rep.by_decoding.setdefault(gt.decoding.label, [0, 0])
        tally[0] += 1
        tally[1] += result.exact
        if on_result:
            on_result(result)
    return rep


def _measured(
    target: Target, records: Iterable[GroundTruth], rep: ValidationReport
) -> Iterator[Measured]:
    """Each record reconstructed and measured; one that cannot be is counted in ``rep.drops``."""
    bound = target.bound
    for gt, sample in _reconstructed(target, records):
        if isinstance(sample, DraftdataError):
            why = sample.reason if isinstance(sample, ReconstructError) else type(sample).__name__
            rep.drops[why] += 1
            continue
        for w in sample.warnings:
            rep.warnings[warning_kind(w)] += 1
        prompt_ids = sample.input_ids[: sample.prompt_len]
        truth_prompt = gt.prompt_ids if gt.prompt_ids is not None else prompt_ids

        # the server's loss, guessed back by the format: measured like any id, tallied per label
        lost = tuple(w for w in sample.warnings if w.startswith("lossy:"))
        result = replace(
            _measure(bound, gt, truth_prompt, prompt_ids, sample.response_ids, sample.token_source),
            lossy=lost,
        )
        yield gt, sample, result


def learning_pairs(
    target: Target, records: Iterable[GroundTruth]
) -> tuple[list[Pair], Counter[str]]:
    """(canonical response ids, model's ids) for every usable ground-truth record (the
    target's split preferences are not applied: they are what is learned)."""
    canonical = target.canonical
    pairs: list[Pair] = []
    drops: Counter[str] = Counter()
    for gt in records:
        try:
            view = gt.view or derive_view(target.bound, gt.output_ids, gt.finish_reason)
            segs, _ = answer_segments(canonical, gt.messages, view)
            ids = canonical.response_ids(segs, gt.finish_reason)
        except DraftdataError as e:
            drops[getattr(e, "reason", type(e).__name__)] += 1
            continue
        pairs.append(Pair(gt.group, ids, list(gt.output_ids)))
    return pairs, drops
