"""A plan before money: what a run will ask for and what it can cost, measured without sending a
request. The datasets are read and their prompts rendered with the target's own format, so the
prompt-token figures are exact for first turns; later on-policy turns depend on answers not yet
given and are bounded from above (every earlier answer at ``max_tokens``).

Problems that would stop or waste a run are listed, not raised: an unset API-key variable, a
server nobody answers at (a TCP connect, no HTTP request), a source that gives no prompts, a
model file that is not there, a run that has nothing to gate on."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..config import DatasetCfg, Manifest
from ..errors import DraftdataError
from ..formats import BoundFormat
from ..measure.contamination import Detector, detector_for
from ..records import Prompt
from ..session import target_of
from ..store.ledger import Ledger
from ..tokens.history import n_turns, stand_in_answers, turn_messages
from ..tokens.sample_maker import TokensStage
from ..tokens.target import Target
from .backends import backend_class
from .contract import Serving, ServingContractError, check_dataset, over_context
from .inputs import drop_reason, read_dataset
from .model_plan import ModelPlan, model_plan


@dataclass(frozen=True)
class DatasetPlan:
    name: str
    backend: str
    backend_kind: str
    ground_truth: bool
    prompts: int
    requests: int
    #: requests already answered in the run's ledger (a resumed run asks only for the rest)
    answered: int
    prompt_tokens: int
    #: prompt tokens of later turns, at most (each earlier answer at max_tokens)
    prompt_tokens_max: int
    completion_tokens_max: int
    cost_min_usd: float
    cost_max_usd: float
    read_drops: dict[str, int] = field(default_factory=dict)
    #: the ledger's answers so far: (responses, their prompt plus completion tokens as counted)
    measured: tuple[int, int] = (0, 0)
    #: the engine ("vllm", "sglang") whose server returns the answers with its own ids, or None
    engine: str | None = None
    #: first-turn prompts whose ids plus max_tokens pass the server's context: skipped, not sent
    over_context: int = 0
    #: the server's context (max_model_len), where it says one
    context: int | None = None
    #: our prompt rendering against the server's own, in one line ("" where not checked)
    rendering: str = ""

    @property
    def remaining(self) -> int:
        return self.requests - self.answered


@dataclass(frozen=True)
class Plan:
    run: str
    output: str
    datasets: tuple[DatasetPlan, ...]
    #: what the gate will measure, and on what evidence
    gate: str
    problems: tuple[str, ...]
    budget_usd: float | None
    #: what the run's model stage ([model]) will forward, or None without one
    model: ModelPlan | None = None

    @property
    def cost_min_usd(self) -> float:
        return sum(d.cost_min_usd for d in self.datasets)

    @property
    def cost_max_usd(self) -> float:
        return sum(d.cost_max_usd for d in self.datasets)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "output": self.output,
            "datasets": [{**d.__dict__, "remaining": d.remaining} for d in self.datasets],
            "cost_min_usd": round(self.cost_min_usd, 6),
            "cost_max_usd": round(self.cost_max_usd, 6),
            "budget_usd": self.budget_usd,
            "gate": self.gate,
            "problems": list(self.problems),
            "model": self.model.to_json() if self.model is not None else None,
        }


def _answered(m: Manifest) -> dict[str, tuple[int, tuple[int, int]]]:
    """Per dataset of the run's ledger: requests answered, and (responses, their tokens)."""
    path = m.output_dir / "ledger.sqlite"
    if not path.is_file():
        return {}
    from ..store.stats import status, throughput

    led = Ledger.read(path)
    try:
        got = {}
        for name, d in status(led).datasets.items():
            t = throughput(led, name)
            got[name] = (d.done, (t.responses, t.prompt_tokens + t.completion_tokens))
        return got
    finally:
        led.close()


def make_plan(m: Manifest) -> Plan:
    target = target_of(m, prefs=False)
    bound = target.bound
    serving = Serving(m)
    stage = TokensStage(target)
    problems: list[str] = []
    try:
        answered = _answered(m)
    except DraftdataError as e:
        answered = {}
        problems.append(f"the run folder's ledger cannot be read: {e}")
    det = None
    if m.run.decontaminate:
        try:
            det = detector_for(m.run.decontaminate, m.base_dir)
        except DraftdataError as e:
            problems.append(f"[run] decontaminate: {e}")
    plans = []
    seen: set[str] = set()  # prompts of earlier datasets: the run drops them again, as here
    for d in m.datasets:
        done, measured = answered.get(d.name, (0, (0, 0)))
        plans.append(
            _dataset_plan(m, d, bound, stage, done, measured, problems, det, seen, serving)
        )
    problems += _backend_problems(m)
    gate = _gate_evidence(m, plans, problems)
    if m.run.budget_usd is not None and sum(p.cost_min_usd for p in plans) > m.run.budget_usd:
        problems.append(
            f"even the cheapest outcome (${sum(p.cost_min_usd for p in plans):.4f}) passes "
            f"budget_usd = {m.run.budget_usd}: the run will stop early; raise the budget or "
            "lower limit"
        )
    return Plan(
        m.run.name,
        str(m.output_dir),
        tuple(plans),
        gate,
        tuple(problems),
        m.run.budget_usd,
        model_plan(m, plans),
    )


def _dataset_plan(
    m: Manifest,
    d: DatasetCfg,
    bound: BoundFormat,
    stage: TokensStage,
    answered: int,
    measured: tuple[int, int],
    problems: list[str],
    det: Detector | None,
    seen: set[str],
    serving: Serving,
) -> DatasetPlan:
    cfg = m.backends[d.backend]
    try:
        prompts, drops = read_dataset(m, d)
    except DraftdataError as e:
        problems.append(f"dataset {d.name}: {e}")
        prompts, drops = [], Counter()
    prompts = _kept(prompts, drops, det, seen)
    if not prompts and not any(p.startswith(f"dataset {d.name}:") for p in problems):
        problems.append(f"dataset {d.name}: {d.source} gives no prompts (skipped: {dict(drops)})")
    s = d.sampling
    engine, rendering = _served(serving, d, prompts, stage.target, problems)
    context = serving.context(d)
    prompt_tokens = prompt_max = requests = over = 0
    for p in prompts:
        turns = n_turns(p, d.turns)
        # later turns answer the model's own earlier answers; the dataset's (or empty ones)
        # stand in, and the upper bound adds max_tokens for each
        answers = stand_in_answers(p, turns)
        for t in range(turns):
            try:
                n = len(stage.render_prompt(turn_messages(p, d.turns, t, answers), p))
            except DraftdataError as e:
                problems.append(f"dataset {d.name}: prompt {p.id} cannot be rendered: {e}")
                continue
            if t == 0 and over_context(context, n, s.max_tokens) is not None:
                over += d.samples_per_prompt  # skipped by the run, never sent
            prompt_tokens += n * d.samples_per_prompt
            prompt_max += (n + t * s.max_tokens) * d.samples_per_prompt
            requests += d.samples_per_prompt
    completion_max = requests * s.max_tokens
    cost = backend_class(cfg.kind).cost_usd
    share_left = (requests - min(answered, requests)) / requests if requests else 0.0
    return DatasetPlan(
        name=d.name,
        backend=d.backend,
        backend_kind=cfg.kind,
        ground_truth=m.is_ground_truth(d),
        prompts=len(prompts),
        requests=requests,
        answered=min(answered, requests),
        prompt_tokens=prompt_tokens,
        prompt_tokens_max=prompt_max,
        completion_tokens_max=completion_max,
        cost_min_usd=cost(cfg, share_left * prompt_tokens, 0),
        cost_max_usd=share_left * cost(cfg, prompt_max, completion_max),
        read_drops=dict(drops),
        measured=measured,
        engine=engine,
        over_context=over,
        context=context,
        rendering=rendering,
    )


def _served(
    serving: Serving, d: DatasetCfg, prompts: list[Prompt], target: Target, problems: list[str]
) -> tuple[str | None, str]:
    """What the dataset's server says (``GET /v1/models``, free): the engine that returns its
    own ids, and on vLLM our prompt ids against its own rendering, said in one line (a
    difference is a problem). A server that does not answer yet returns the engine its backend
    names (``server = "vllm"``), and nothing is compared."""
    if not prompts:
        return None, ""
    if serving.served(d.backend) is None:
        return serving.engine(d), ""
    try:
        line = check_dataset(serving, d, target, prompts)
        rendering = line.split(": ", 1)[1] if line else ""
    except ServingContractError as e:
        problems.append(str(e))
        rendering = "differs from the server's (see the problem below)"
    return serving.engine(d), rendering


def _kept(
    prompts: list[Prompt], drops: Counter[str], det: Detector | None, seen: set[str]
) -> list[Prompt]:
    """What the run keeps of a dataset's prompts (``drop_reason``, as ``Runner.prompts`` drops
    them), the rest counted in ``drops``; the kept ones are added to ``seen``."""
    out = []
    for p in prompts:
        why = drop_reason(p, seen, det)
        if why is None:
            out.append(p)
        else:
            drops[why] += 1
    seen.update(p.id for p in out)
    return out


def _backend_problems(m: Manifest) -> list[str]:
    """Each used backend's own preflight checks (``Backend.preflight``: no request is sent)."""
    used = {d.backend for d in m.datasets}
    return [
        problem
        for name, cfg in m.backends.items()
        if name in used
        for problem in backend_class(cfg.kind).preflight(name, cfg, m)
    ]


def _gate_evidence(m: Manifest, plans: list[DatasetPlan], problems: list[str]) -> str:
    gt = [p for p in plans if p.ground_truth]
    engine = [p for p in plans if not p.ground_truth and p.engine]
    text = [p for p in plans if not p.ground_truth and not p.engine]
    if not text:
        return "nothing to gate: every dataset's backend returns exact ids"
    evidence = []
    if m.run.ground_truth:
        path = m.resolve(m.run.ground_truth)
        if not path.is_file():
            problems.append(f"[run] ground_truth = {m.run.ground_truth!r}: {path} does not exist")
        evidence.append(f"the ground-truth file {path}")
    if gt:
        evidence.append(
            "the exact-id answers of " + ", ".join(f"{p.name} ({p.requests})" for p in gt)
        )
    if engine:
        evidence.append(
            "the server's own ids of "
            + ", ".join(f"{p.name} ({p.requests}, {p.engine})" for p in engine)
            + ", each answer's text view reconstructed and measured against its ids"
        )
    names = ", ".join(p.name for p in text)
    if not evidence:
        problems.append(
            f"nothing to gate on: {names} return text, and no dataset returns exact ids; add a "
            'ground-truth dataset (kind = "hf"), a dataset on a vLLM or SGLang server asked for '
            'its ids (token_ids = "auto"), or [run] ground_truth = "file.jsonl", or the run '
            "stops before them (unless --force)"
        )
        return f"no evidence: {names} wait on a gate that cannot be measured"
    return (
        f"reconstruction measured on {' and '.join(evidence)} must reach min_exact "
        f"{m.run.min_exact} before {names} {'sends' if len(text) == 1 else 'send'} a request"
    )
