"""``draftdata evaluate``: a drafter measured on held-out prompts, dataset by dataset, through a
vLLM server's own counters (one it starts here with the drafter at each K, or one it is pointed
at), beside the same server without a drafter (tokens/s), and optionally simulated in process
over the engine's own answers (``simulate``)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import AcceptanceError
from ..records.acceptance import Acceptance, DatasetAcceptance
from . import engine, metrics
from .engine import Answer, Asked
from .held_out import EvalSet
from .serve import Speculation, vllm_server

#: the largest |simulated AL - engine AL| read as numerics on greedy answers of a float32
#: engine (BENCHMARKS.md, "From data to acceptance"; measured differences were well under it)
TOLERANCE = 0.02

Say = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """What to measure and how."""

    sets: list[EvalSet]
    #: the drafters to serve, each at its K (empty: measure ``server`` as it is)
    speculations: list[Speculation]
    temperature: float = 0.0
    max_tokens: int = 256
    concurrency: int = 8
    #: the target's folder and the vLLM Python that serves it (to start servers here)
    folder: Path | None = None
    vllm: Path | None = None
    dtype: str = "float32"
    max_model_len: int = 2048
    #: a running server to measure instead of starting one, and one without a drafter
    server: str | None = None
    baseline_url: str | None = None
    #: start a server without a drafter here and measure the same requests on it
    baseline: bool = True
    #: simulate each drafter over the engine's answers (needs ``folder`` and a drafter)
    simulate: bool = False
    drafter: Path | None = None
    logs: Path = Path(".")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def _measure_all(
    url: str, p: Plan, say: Say
) -> tuple[list[DatasetAcceptance], dict[str, list[Answer]]]:
    """Every dataset through the server at ``url``: its rows and its answers by dataset."""
    asked = Asked(url, engine.served_model(url), p.temperature, p.max_tokens, p.concurrency)
    rows, answers = [], {}
    for es in p.sets:
        t = time.monotonic()
        row, got, refused = engine.measure(asked, es)
        rows.append(row)
        answers[es.name] = got
        e = row.engine
        al = (
            f"AL {e.al:.3f} at K={len(e.accepted_per_pos)}"
            if e is not None and e.drafts
            else "no drafts"
        )
        more = f", refused {refused}" if refused else ""
        say(
            f"  {es.name}: {row.prompts} prompts, {row.completion_tokens} tokens, "
            f"{row.tokens_per_s:.1f} tokens/s, {al}{more} ({time.monotonic() - t:.0f} s)"
        )
    return rows, answers


def _baseline(p: Plan, say: Say) -> dict[str, float]:
    """tokens/s of each dataset on the server without a drafter (empty: not measured)."""
    if p.baseline_url is not None:
        say(f"baseline: {p.baseline_url} (no drafter)")
        rows, _ = _measure_all(p.baseline_url, p, say)
    elif p.baseline and p.server is None:
        say("baseline: the target without a drafter")
        with _started(p, None) as url:
            rows, _ = _measure_all(url, p, say)
    else:
        return {}
    for r in rows:
        if r.engine is not None and r.engine.drafts:
            raise AcceptanceError(
                f"the baseline server drafted {r.engine.drafts} times on {r.dataset}: give a "
                "server started without --speculative-config"
            )
    return {r.dataset: r.tokens_per_s for r in rows}


def _can_start(p: Plan) -> None:
    """Refuse, naming what is missing, a plan that must start servers and cannot."""
    missing = [
        what
        for what, have in (
            ("no --vllm PYTHON (a venv with vLLM)", p.vllm),
            ("no --model (the target; or a RUN whose [model] path names it)", p.folder),
        )
        if have is None
    ]
    if missing:
        raise AcceptanceError(
            f"draftdata evaluate: {' and '.join(missing)} to start servers with; give it, or "
            "measure a running server with --server URL"
        )


@contextlib.contextmanager
def _started(p: Plan, spec: Speculation | None) -> Iterator[str]:
    """A server started here for ``spec`` (None: the target alone); its base URL."""
    assert p.vllm is not None and p.folder is not None  # _can_start, before anything is measured
    name = "baseline" if spec is None else f"{_slug(spec.label)}-k{spec.k}"
    with vllm_server(
        p.vllm,
        p.folder,
        p.logs / f"vllm-{name}.log",
        speculation=spec,
        dtype=p.dtype,
        max_model_len=p.max_model_len,
    ) as (url, _waited):
        yield url


def _simulated(
    p: Plan,
    rows: list[DatasetAcceptance],
    answers: dict[str, list[Answer]],
    k: int,
    sim: tuple[object, object] | None,
    say: Say,
) -> list[DatasetAcceptance]:
    from .simulate import simulate

    assert sim is not None
    lm, drafter = sim
    out = []
    for row in rows:
        pairs = [(a.prompt_ids or (), a.ids or ()) for a in answers[row.dataset]]
        t = time.monotonic()
        counts, left = simulate(lm, drafter, pairs, k)  # type: ignore[arg-type]
        row = replace(row, simulated=counts, unsimulated=left)
        diff = row.al_difference
        say(
            f"  {row.dataset}: simulated AL {counts.al:.3f}"
            + (f" ({diff:+.3f} against the engine)" if diff is not None else "")
            + (f", left out {left}" if left else "")
            + f" ({time.monotonic() - t:.0f} s)"
        )
        out.append(row)
    return out


def _load_simulator(p: Plan) -> tuple[object, object]:
    from ..model.load import load_causal_lm
    from .simulate import Drafter

    if p.folder is None or p.drafter is None:
        raise AcceptanceError(
            "--simulate needs the drafter (--drafter DIR) and the target (--model)"
        )
    lm = load_causal_lm(p.folder, dtype="float32")
    return lm, Drafter(p.drafter, p.folder, lm.torch)


def evaluate(p: Plan, say: Say, stamp: str = "") -> list[Acceptance]:
    """Measure every drafter of the plan on every dataset; one ``Acceptance`` per drafter and K."""
    if p.server is None:
        _can_start(p)
    base = _baseline(p, say)
    sim = _load_simulator(p) if p.simulate else None
    engine_name = f"vLLM ({p.dtype})" if p.server is None else p.server
    results = []
    targets: list[tuple[Speculation | None, str | None]] = (
        [(None, p.server)] if p.server is not None else [(s, None) for s in p.speculations]
    )
    for spec, url in targets:
        if url is not None:
            before = metrics.read(url)
            k = len(before.spec.accepted_per_pos)
            if not before.speculating or k == 0:
                raise AcceptanceError(
                    f"{url}: the server exports no spec-decode counters, so it drafts nothing; "
                    "start it with --speculative-config"
                )
            rows, answers = _measure_all(url, p, say)
            method, drafter = "server", (str(p.drafter) if p.drafter else None)
        else:
            assert spec is not None
            k = spec.k
            say(f"{spec.label} at K={k}")
            with _started(p, spec) as started:
                rows, answers = _measure_all(started, p, say)
            method = spec.method
            drafter = str(spec.model) if spec.model is not None else None
        rows = [replace(r, baseline_tokens_per_s=base.get(r.dataset)) for r in rows]
        if sim is not None and (spec is None or spec.model is not None):
            rows = _simulated(p, rows, answers, k, sim, say)
        results.append(
            Acceptance(
                method,
                k,
                drafter,
                engine_name,
                p.temperature,
                p.max_tokens,
                tuple(rows),
                stamp,
                TOLERANCE if sim is not None else None,
            )
        )
    return results
