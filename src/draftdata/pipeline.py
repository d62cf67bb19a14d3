"""`draftdata run`: read -> generate -> tokens -> validate (gate) -> export, as a list of stages
(``STAGES``) over one value (``Staged``: the run, its Runner, the evidence, the target);
``draftdata generate`` runs a prefix of it (``GENERATE``). Orchestration only: each stage is
restartable.

Ground-truth datasets (exact ids from the target itself) are generated first; reconstruction is
measured on them and gates the datasets whose backend returns text (see ``measure.gate``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from .config import DatasetCfg, Manifest, ModelCfg, redact_url
from .errors import ReconstructError
from .export.run_export import export_run
from .files import write_json
from .generate.runner import Runner, RunReport
from .measure.gate import Gate, GateError, gate_on
from .measure.validate import ValidationReport
from .model.sample_repair import validate_repaired
from .progress import Ticker
from .records import GroundTruth
from .records.servers import profile
from .session import Run
from .store.meta import COUNTING, GATE
from .tokens.counts import fit, server_key, shape_of
from .tokens.reconstruct import check_ids
from .tokens.run_samples import Tokenized
from .tokens.sample_maker import TokensStage
from .tokens.target import Target


@dataclass
class PipelineResult:
    run_dir: Path
    export_dir: Path | None = None
    validation: ValidationReport | None = None
    gate: Gate | None = None
    datasets: dict[str, Tokenized] = field(default_factory=dict)
    budget_stopped: bool = False
    scores: dict[str, Any] | None = None
    #: datasets stopped before their last answer, with the line that says why
    stopped: dict[str, str] = field(default_factory=dict)
    #: per engine backend: what its token counts showed against its own ids (one line)
    counting: dict[str, str] = field(default_factory=dict)


def ground_truth(run: Run, d: DatasetCfg, with_view: bool = False) -> Iterator[GroundTruth]:
    """The engine's exact answers as ground truth, with the conversations they answered. The
    prompt ids are the ones the server says it fed the model, where it says so. Each carries
    the dataset's decoding: the gate's repair reads an unknown one as greedy, and would then
    "fix" every token a sampled answer did not take from the arg-max. ``with_view``: each
    carries the text view its server returned beside the ids (a vLLM or SGLang server asked for
    its ids), so the gate reconstructs what the server really said; otherwise the view is
    derived from the ids."""
    bound = run.target.bound
    stage = TokensStage(run.target)
    decoding = d.sampling.decoding
    for a in run.tokens_stage(run.target, None).conversations(d):
        key, p, msgs, r = a.key, a.prompt, a.messages, a.stored
        if r.output_ids is None:
            continue
        try:
            out = check_ids(bound, r.output_ids, "output_ids")
            prompt = r.server_prompt_ids or r.our_prompt_ids or stage.render_prompt(msgs, p)
            check_ids(bound, prompt, "prompt_ids")
        except ReconstructError:
            continue  # the tokens stage drops and counts it
        yield GroundTruth(
            id=key.sample_id,
            messages=msgs,
            prompt_ids=tuple(prompt),
            output_ids=tuple(bound.closed(out, r.finish_reason)),
            finish_reason=r.finish_reason,
            tools=p.tools,
            group=key.prompt_id,
            source=d.name,
            view=a.view if with_view else None,
            decoding=decoding,
        )


def ground_truth_file(m: Manifest) -> list[GroundTruth]:
    """``[run] ground_truth``: an existing ground-truth JSONL as the gate's evidence. Records that
    cannot be used are skipped; a file with none is an error that names it."""
    if not m.run.ground_truth:
        return []
    from collections import Counter

    from .errors import InputError
    from .sources import read_ground_truth

    path = m.resolve(m.run.ground_truth)
    if not path.is_file():
        raise InputError(f"[run] ground_truth = {m.run.ground_truth!r}: {path} does not exist")
    skipped: Counter[str] = Counter()
    out = read_ground_truth(path, skipped)
    if not out:
        raise InputError(
            f"[run] ground_truth: {path} holds no usable ground-truth record "
            f"({sum(skipped.values())} skipped); each line needs messages, prompt_ids and "
            "output_ids"
        )
    return out


@dataclass(frozen=True)
class Shown:
    """Where a stage says what it does: quiet, or a console with a progress line every
    ``every`` seconds."""

    quiet: bool
    console: Console
    every: float

    @property
    def to(self) -> Console | None:
        return None if self.quiet else self.console


@dataclass
class Staged:
    """The one value the stages pass along: the run (opened to write, its writer admitted),
    its Runner, what each wave generates, the evidence gathered so far, the target (learning
    split preferences on the evidence replaces it) and the result being filled."""

    run: Run
    runner: Runner
    shown: Shown
    force: bool
    result: PipelineResult
    target: Target
    #: generated first: the datasets whose ids are exact (ground truth, an engine's own ids);
    #: ``draftdata generate``: every dataset it names
    first: list[DatasetCfg]
    #: generated after the gate: the datasets whose backend returns text
    text: list[DatasetCfg]
    #: the datasets on a vLLM / SGLang server asked for its ids, with the engine's name
    engine: dict[str, str] = field(default_factory=dict)
    evidence: list[GroundTruth] = field(default_factory=list)
    #: what the evidence is, said in the gate's line
    said: list[str] = field(default_factory=list)
    #: the first wave's generation report (``draftdata generate`` prints it)
    report: RunReport | None = None
    scorer: Any = None


Stage = Callable[[Staged], None]


def read_stage(s: Staged) -> None:
    """1. Read every dataset of both waves (duplicates across datasets are dropped in
    manifest order)."""
    names = {d.name for d in (*s.first, *s.text)}
    for d in s.run.manifest.datasets:
        if d.name in names:
            s.runner.prompts(d)


def first_stage(s: Staged) -> None:
    """2. The first wave's answers: ground truth, exact ids from the target or the engine
    serving it."""
    if s.first:
        s.report = asyncio.run(s.runner.generate([d.name for d in s.first]))


def first_samples_stage(s: Staged) -> None:
    """3. The first wave's samples."""
    s.result.datasets.update(tokens_stage(s.run, s.target, s.first, s.shown))


def evidence_stage(s: Staged) -> None:
    """4. The evidence the gate measures on: the ground-truth file's (read at the start), and
    the exact answers of the first wave; each engine server's counting convention checked on its own ids."""
    m, res = s.run.manifest, s.result
    by_backend: dict[str, list[GroundTruth]] = {}
    for d in s.first:
        got = list(ground_truth(s.run, d, with_view=d.name in s.engine))
        s.evidence += got
        if d.name in s.engine:  # by server: a text-only backend on it is counted so too
            by_backend.setdefault(server_key(m, d.backend), []).extend(got)
        who = f"the {s.engine[d.name]} server's own ids" if d.name in s.engine else "answers"
        s.said.append(f"{who} of {d.name} ({len(got)})")
    for key, got in by_backend.items():  # every engine dataset of a server at once
        res.counting.update(check_counting(s.run, key, got, s.shown))
    s.scorer = _scorer(m)


def validate_stage(s: Staged) -> None:
    """5. Reconstruction measured on the evidence (repaired by the model first, where [model]
    says so), the split preferences learned on it where the run learns them."""
    if s.evidence:
        s.result.validation, s.target = measure(s.run, s.target, s.evidence, s.scorer, s.shown)
        write_json(s.run.manifest.output_dir / "validation.json", s.result.validation.to_json())


def gate_stage_of(s: Staged) -> None:
    """6. The gate, before the first paid request of a dataset that waits on it: the text
    datasets, and an engine dataset whose server gave some answers no ids."""
    waits = [d.name for d in s.text] + [n for n in s.engine if _reconstructed(s.result, n)]
    s.result.gate = gate_stage(s.run, s.result.validation, s.said, bool(waits), s.force)


def text_stage(s: Staged) -> None:
    """7. The text backends' answers and their samples, made with the gate's target."""
    if s.text:
        s.runner.watch.target = s.target  # the count gate reads text as the run will
        rep = asyncio.run(s.runner.generate([d.name for d in s.text]))
        s.result.datasets.update(tokens_stage(s.run, s.target, s.text, s.shown))
        s.result.budget_stopped, s.result.stopped = rep.budget_stopped, rep.stopped


def model_stage_of(s: Staged) -> None:
    """8. The model stage: every sample scored, the reconstructed ones repaired."""
    m = s.run.manifest
    if s.scorer is not None and m.model is not None:
        s.result.scores = model_stage(s.run, s.target, s.scorer, m.model, s.shown)


def export_stage(s: Staged) -> None:
    """9. The export."""
    res = s.result
    res.export_dir = export_run(
        s.run.ledger, s.run.manifest, s.target, res.validation, res.gate,
        checks=s.run.checks, console=s.shown.to,
    )  # fmt: skip


#: ``draftdata run``: every stage in turn
STAGES: tuple[Stage, ...] = (
    read_stage,
    first_stage,
    first_samples_stage,
    evidence_stage,
    validate_stage,
    gate_stage_of,
    text_stage,
    model_stage_of,
    export_stage,
)
#: ``draftdata generate``: the prefix that asks for answers and makes their samples (every
#: dataset it names in the first wave; no gate, no model stage, no export)
GENERATE = STAGES[:3]


def run_pipeline(
    m: Manifest,
    *,
    force: bool = False,
    quiet: bool = False,
    console: Console | None = None,
    command_line: list[str] | None = None,
    progress_every: float = 30.0,
    extend: bool = False,
    stages: tuple[Stage, ...] = STAGES,
    only: list[str] | None = None,
) -> Staged:
    """Open the run to write (its writer admitted: ``session.Run.open``) and run ``stages``
    over it (``STAGES``: ``draftdata run``; ``GENERATE``: ``draftdata generate``, over the
    datasets ``only`` names, every one when None). Returns the stages' value; its ``result``
    is what ``run`` reports."""
    shown = Shown(quiet, console or Console(stderr=True), progress_every)
    what = " ".join(command_line or ["draftdata"])
    with Run.open(
        m, write=True, what=what, command_line=command_line, extend=extend, console=shown.to
    ) as run:
        runner = Runner(
            run, quiet=quiet, console=shown.console, progress_every=progress_every, extend=extend
        )
        try:
            s = _staged(run, runner, shown, force, stages is GENERATE, only)
            for stage in stages:
                stage(s)
        finally:
            runner.close()
        return s


def _staged(
    run: Run, runner: Runner, shown: Shown, force: bool, generate: bool, only: list[str] | None
) -> Staged:
    """The stages' value at the start: which datasets each wave generates."""
    m = run.manifest
    res = PipelineResult(run_dir=m.output_dir)
    if generate:
        chosen = [m.dataset(n) for n in only] if only else list(m.datasets)
        return Staged(run, runner, shown, force, res, run.target, chosen, [])
    engine = {
        d.name: e
        for d in m.datasets
        if not m.is_ground_truth(d) and (e := runner.serving.engine(d)) is not None
    }
    first = [d for d in m.datasets if m.is_ground_truth(d) or d.name in engine]
    text = [d for d in m.datasets if not (m.is_ground_truth(d) or d.name in engine)]
    s = Staged(run, runner, shown, force, res, run.target, first, text, engine)
    s.evidence = ground_truth_file(m)  # a bad file is said before anything is paid
    s.said = [f"the ground-truth file {m.run.ground_truth} ({len(s.evidence)})"] * bool(s.evidence)
    return s


def check_counting(run: Run, server: str, got: list[GroundTruth], shown: Shown) -> dict[str, str]:
    """The server's counting convention checked on its own ids, the answers of every engine
    dataset on it (``tokens.counts.fit``), and kept for every backend's text answers from it
    (``server``: ``tokens.counts.server_key``)."""
    bound = run.target.bound
    obs = [
        (shape_of(bound, [*g.prompt_ids, *g.output_ids], len(g.prompt_ids)), g.view.usage)
        for g in got
        if g.view is not None and g.view.usage is not None and g.prompt_ids is not None
    ]
    kind = next((g.view.server for g in got if g.view is not None), None)
    fitted = fit(obs, profile(kind).counting)
    if fitted is None:
        return {}
    run.ledger.meta.put(COUNTING.of(server), fitted.counting)
    line = fitted.line(f"{redact_url(server)} ({kind or 'auto'})")
    if shown.to is not None:
        shown.to.print(Text(line))
    return {redact_url(server): line}


def tokens_stage(
    run: Run, target: Target, datasets: list[DatasetCfg], shown: Shown
) -> dict[str, Tokenized]:
    """The samples of every stored answer of ``datasets`` not yet decided, made with
    ``target``."""
    stage = run.tokens_stage(target, shown.to)
    return {d.name: stage.make(d) for d in datasets}


def gate_stage(
    run: Run,
    validation: ValidationReport | None,
    said: list[str],
    gated: bool,
    force: bool,
) -> Gate:
    """The gate on the validation, recorded in the ledger; a GateError when it fails before a
    dataset that waits on it (``gated``) and ``force`` is not given."""
    m = run.manifest
    gate = gate_on(m.run.min_exact, validation, gated=gated).on(", ".join(said))
    if gated and not gate.passed:
        if not force:
            run.ledger.meta.put(GATE, gate.record())
            raise GateError(
                f"gate failed before any paid request: {gate.reason}; fix the format or "
                "learn split preferences (`draftdata learn`), or pass --force to override"
            )
        gate = gate.force()
    run.ledger.meta.put(GATE, gate.record())
    return gate


def _reconstructed(res: PipelineResult, name: str) -> bool:
    """Whether some of the dataset's samples were made from text (its server gave no ids)."""
    got = res.datasets.get(name)
    return got is not None and any(k != "engine" and n for k, n in got.samples.items())


def _scorer(m: Manifest) -> Any:
    """The run's [model]: a model in this process, or the server of a URL or a backend's name."""
    from .generate.scoring import manifest_scorer

    return manifest_scorer(m)


def model_stage(
    run: Run, target: Target, scorer: Any, cfg: ModelCfg, shown: Shown
) -> dict[str, Any]:
    """Score (and repair) every sample of the run not yet scored; RUN/scores.json."""
    from .model.run_scores import score_stage

    what = "model stage: scoring and repairing" if cfg.repair else "model stage: scoring"

    def progress(todo: int) -> Callable[[object], None] | None:
        return Ticker(what, todo, shown.every, shown.console, "samples").tick if todo else None

    doc = score_stage(
        run, target, scorer, threshold=cfg.threshold, repair=cfg.repair,
        extra={"model": cfg.path}, progress=None if shown.quiet else progress,
    )  # fmt: skip
    scored, repaired = doc["scored_now"], doc["repaired_now"]
    if not shown.quiet:
        shown.console.print(
            f"model stage: {scored} samples scored, {repaired} repaired, "
            f"{doc.get('flagged_samples', 0)} flagged (log p below {cfg.threshold})",
            highlight=False,
        )
        for why, n in (doc.get("unscorable_now") or {}).items():
            shown.console.print(
                Text(f"model stage: {n} sample(s) the model could not score: {why}")
            )
    return doc


def measure(
    run: Run,
    target: Target,
    records: list[GroundTruth],
    scorer: Any,
    shown: Shown,
) -> tuple[ValidationReport, Target]:
    """Validation on the run's ground truth (cross-validated where preferences are learned),
    with the target the rest of the run uses (the learned preferences, where it learns
    them); repaired by the target model first when the manifest's [model] asks for repair, with
    a progress line (the repair forwards the model, minutes on a CPU)."""
    m, bound = run.manifest, target.bound
    repairing = scorer is not None and m.model is not None and m.model.repair
    tick: Callable[[Any], None] | None = None
    if repairing and not shown.quiet:
        what = "gate: repairing and measuring"
        tick = Ticker(what, len(records), shown.every, shown.console).tick
    with_model = scorer if repairing else None
    if m.run.learn_prefs and records:
        report, target = learn_and_validate(run, target, records, with_model, tick)
    else:
        report = validate_repaired(target, records, with_model, on_result=tick)
    report.meta = {
        **report.meta,
        "format": bound.format.name,
        "format_version": bound.format.version,
        "tokenizer_sha256": bound.tokenizer.sha256,
        "prefs": m.target.prefs,
    }
    return report, target


def learn_and_validate(
    run: Run,
    target: Target,
    records: list[GroundTruth],
    scorer: Any = None,
    tick: Callable[[Any], None] | None = None,
) -> tuple[ValidationReport, Target]:
    """Learn split preferences from the run's own ground truth. The figure the gate sees is
    cross-validated: preferences learned on one half of the prompts are measured on the other,
    both ways. The preferences learned on all of it are saved (RUN/prefs.json) and returned in
    the target the text datasets are made with."""
    from .measure.validate import learning_pairs
    from .tokens.prefs import _bucket, learn

    tok = target.tokenizer
    halves = (
        [r for r in records if _bucket(r.group) < 0.5],
        [r for r in records if _bucket(r.group) >= 0.5],
    )
    report = ValidationReport()

    def on_result(result: Any) -> None:
        report.add(result)
        if tick is not None:
            tick(result)

    for learn_on, measure_on in ((halves[0], halves[1]), (halves[1], halves[0])):
        if not measure_on:
            continue
        pairs, _ = learning_pairs(target, learn_on)
        applier = learn(tok, pairs).applier(tok) if pairs else None
        inner = validate_repaired(
            target.with_prefs(applier), measure_on, scorer, on_result=on_result,
            repair_with=target,
        )  # fmt: skip
        report.drops.update(inner.drops)
        report.warnings.update(inner.warnings)
    pairs, _ = learning_pairs(target, records)
    prefs = learn(tok, pairs)
    prefs.save(run.manifest.output_dir / "prefs.json")
    report.meta = {"prefs_rules": len(prefs.rules), "cross_validated": True}
    return report, target.with_prefs(prefs.applier(tok))


__all__ = ["GateError", "PipelineResult", "ground_truth", "run_pipeline"]
