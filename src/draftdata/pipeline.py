"""`draftdata run`: read -> generate -> tokens -> validate (gate) -> export. Orchestration only:
each step is a stage's function from records to records, and each is restartable.

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
from .generate.runner import Runner
from .measure.gate import Gate, GateError, gate_on
from .measure.validate import ValidationReport
from .model.sample_repair import validate_repaired
from .progress import Ticker
from .records import GroundTruth
from .records.servers import profile
from .session import RunSession
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


def ground_truth(
    session: RunSession, d: DatasetCfg, with_view: bool = False
) -> Iterator[GroundTruth]:
    """The engine's exact answers as ground truth, with the conversations they answered. The
    prompt ids are the ones the server says it fed the model, where it says so. Each carries
    the dataset's decoding: the gate's repair reads an unknown one as greedy, and would then
    "fix" every token a sampled answer did not take from the arg-max. ``with_view``: each
    carries the text view its server returned beside the ids (a vLLM or SGLang server asked for
    its ids), so the gate reconstructs what the server really said; otherwise the view is
    derived from the ids."""
    bound = session.target.bound
    stage = TokensStage(session.target)
    decoding = d.sampling.decoding
    for a in session.tokens_stage(session.target, None).conversations(d):
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


def run_pipeline(
    m: Manifest,
    *,
    force: bool = False,
    quiet: bool = False,
    console: Console | None = None,
    command_line: list[str] | None = None,
    progress_every: float = 30.0,
    extend: bool = False,
) -> PipelineResult:
    shown = Shown(quiet, console or Console(stderr=True), progress_every)
    what = " ".join(command_line or ["draftdata"])
    with RunSession.open(m, write=True, what=what) as session:
        runner = Runner(
            m,
            quiet=quiet,
            console=shown.console,
            command_line=command_line,
            progress_every=progress_every,
            extend=extend,
            session=session,
        )
        return _stages(session, runner, shown, force)


def _stages(session: RunSession, runner: Runner, shown: Shown, force: bool) -> PipelineResult:
    """Each stage in turn, the target passed from one to the next as a value (learning split
    preferences on the gate's evidence returns a new one)."""
    m, target = session.manifest, session.target
    res = PipelineResult(run_dir=m.output_dir)
    # datasets on a vLLM / SGLang server asked for its ids: exact, and evidence for the rest
    engine = {
        d.name: e
        for d in m.datasets
        if not m.is_ground_truth(d) and (e := runner.serving.engine(d)) is not None
    }
    exact = [d for d in m.datasets if m.is_ground_truth(d) or d.name in engine]
    text = [d for d in m.datasets if not (m.is_ground_truth(d) or d.name in engine)]
    # what waits on the gate: the text datasets, and an engine dataset whose server gave some
    # answers no ids (those were reconstructed)
    waits = [d.name for d in text]
    # 1. read every dataset (duplicates across datasets are dropped in manifest order)
    for d in m.datasets:
        runner.prompts(d)
    # 2. ground truth: exact ids from the target itself, or from the engine serving it
    evidence = ground_truth_file(m)
    said = [f"the ground-truth file {m.run.ground_truth} ({len(evidence)})"] if evidence else []
    if exact:
        asyncio.run(runner.generate([d.name for d in exact]))
        res.datasets.update(tokens_stage(session, target, exact, shown))
        by_backend: dict[str, list[GroundTruth]] = {}
        for d in exact:
            got = list(ground_truth(session, d, with_view=d.name in engine))
            evidence += got
            if d.name in engine:  # by server: a text-only backend on it is counted so too
                by_backend.setdefault(server_key(m, d.backend), []).extend(got)
            who = f"the {engine[d.name]} server's own ids" if d.name in engine else "answers"
            said.append(f"{who} of {d.name} ({len(got)})")
        waits += [n for n in engine if _reconstructed(res, n)]
        for key, got in by_backend.items():  # every engine dataset of a server at once
            res.counting.update(check_counting(session, key, got, shown))
    scorer = _scorer(m)
    # 3. validate reconstruction on it (repaired by the model first, where [model] says so)
    if evidence:
        res.validation, target = measure(session, target, evidence, scorer, shown)
        write_json(m.output_dir / "validation.json", res.validation.to_json())
    # 4. the gate, before the first paid request of a text dataset
    res.gate = gate_stage(session, res.validation, said, bool(waits), force)
    # 5. the text backends
    if text:
        runner.watch.target = target  # the count gate reads text as the run will
        rep = asyncio.run(runner.generate([d.name for d in text]))
        res.datasets.update(tokens_stage(session, target, text, shown))
        res.budget_stopped, res.stopped = rep.budget_stopped, rep.stopped
    # 6. the model stage: score every sample, repair the reconstructed ones
    if scorer is not None and m.model is not None:
        res.scores = model_stage(session, target, scorer, m.model, shown)
    # 7. export
    res.export_dir = export_run(
        session.ledger,
        m,
        target,
        res.validation,
        res.gate,
        checks=session.checks,
        console=shown.to,
    )
    return res


def check_counting(
    session: RunSession, server: str, got: list[GroundTruth], shown: Shown
) -> dict[str, str]:
    """The server's counting convention checked on its own ids, the answers of every engine
    dataset on it (``tokens.counts.fit``), and kept for every backend's text answers from it
    (``server``: ``tokens.counts.server_key``)."""
    bound = session.target.bound
    obs = [
        (shape_of(bound, [*g.prompt_ids, *g.output_ids], len(g.prompt_ids)), g.view.usage)
        for g in got
        if g.view is not None and g.view.usage is not None and g.prompt_ids is not None
    ]
    kind = next((g.view.server for g in got if g.view is not None), None)
    fitted = fit(obs, profile(kind).counting)
    if fitted is None:
        return {}
    session.ledger.meta.put(COUNTING.of(server), fitted.counting)
    line = fitted.line(f"{redact_url(server)} ({kind or 'auto'})")
    if shown.to is not None:
        shown.to.print(Text(line))
    return {redact_url(server): line}


def tokens_stage(
    session: RunSession, target: Target, datasets: list[DatasetCfg], shown: Shown
) -> dict[str, Tokenized]:
    """The samples of every stored answer of ``datasets`` not yet decided, made with
    ``target``."""
    stage = session.tokens_stage(target, shown.to)
    return {d.name: stage.make(d) for d in datasets}


def gate_stage(
    session: RunSession,
    validation: ValidationReport | None,
    said: list[str],
    gated: bool,
    force: bool,
) -> Gate:
    """The gate on the validation, recorded in the ledger; a GateError when it fails before a
    dataset that waits on it (``gated``) and ``force`` is not given."""
    m = session.manifest
    gate = gate_on(m.run.min_exact, validation, gated=gated).on(", ".join(said))
    if gated and not gate.passed:
        if not force:
            session.ledger.meta.put(GATE, gate.record())
            raise GateError(
                f"gate failed before any paid request: {gate.reason}; fix the format or "
                "learn split preferences (`draftdata learn`), or pass --force to override"
            )
        gate = gate.force()
    session.ledger.meta.put(GATE, gate.record())
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
    session: RunSession, target: Target, scorer: Any, cfg: ModelCfg, shown: Shown
) -> dict[str, Any]:
    """Score (and repair) every sample of the run not yet scored; RUN/scores.json."""
    from .model.run_scores import score_stage

    what = "model stage: scoring and repairing" if cfg.repair else "model stage: scoring"

    def progress(todo: int) -> Callable[[object], None] | None:
        return Ticker(what, todo, shown.every, shown.console, "samples").tick if todo else None

    doc = score_stage(
        session, target, scorer, threshold=cfg.threshold, repair=cfg.repair,
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
    session: RunSession,
    target: Target,
    records: list[GroundTruth],
    scorer: Any,
    shown: Shown,
) -> tuple[ValidationReport, Target]:
    """Validation on the run's ground truth (cross-validated where preferences are learned),
    with the target the rest of the run uses (the learned preferences, where it learns
    them); repaired by the target model first when the manifest's [model] asks for repair, with
    a progress line (the repair forwards the model, minutes on a CPU)."""
    m, bound = session.manifest, target.bound
    repairing = scorer is not None and m.model is not None and m.model.repair
    tick: Callable[[Any], None] | None = None
    if repairing and not shown.quiet:
        what = "gate: repairing and measuring"
        tick = Ticker(what, len(records), shown.every, shown.console).tick
    with_model = scorer if repairing else None
    if m.run.learn_prefs and records:
        report, target = learn_and_validate(session, target, records, with_model, tick)
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
    session: RunSession,
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
    prefs.save(session.manifest.output_dir / "prefs.json")
    report.meta = {"prefs_rules": len(prefs.rules), "cross_validated": True}
    return report, target.with_prefs(prefs.applier(tok))


__all__ = ["GateError", "PipelineResult", "ground_truth", "run_pipeline"]
