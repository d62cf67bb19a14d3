"""CLI commands for generation and the whole job: generate, status, replay-server, run,
report, export."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ..errors import InputError
from ..export.trainers import EXPORTERS
from .app import app, command_line, err, out
from .show import print_validation

if TYPE_CHECKING:
    from ..store.stats import RunStatus

# --- generation -------------------------------------------------------------------------------
ManifestArg = Annotated[Path, typer.Argument(help="the run manifest (TOML)")]


@app.command()
def generate(
    manifest: ManifestArg,
    dataset: Annotated[
        list[str] | None, typer.Option("--dataset", "-d", help="only this dataset (repeatable)")
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="no progress bars (logs, CI)")
    ] = False,
) -> None:
    """Generate answers into the run's ledger and make samples. Resume: run it again."""
    import asyncio

    from ..generate.runner import Runner
    from ..manifest import load_manifest
    from ..store.stats import status as ledger_status

    m = load_manifest(manifest)
    runner = Runner(m, quiet=quiet, console=err, command_line=command_line())
    try:
        rep = asyncio.run(runner.run(dataset))
        st = ledger_status(runner.ledger)
    except KeyboardInterrupt:
        err.print(
            "interrupted: everything answered so far is in the ledger; run the same "
            "command again to resume"
        )
        raise typer.Exit(130) from None
    finally:
        runner.ledger.close()
    for name, d in rep.datasets.items():
        drops = ", ".join(f"{k}: {v}" for k, v in d.drops.items())
        out.print(f"{name}: samples {d.samples or 0}" + (f"; dropped {drops}" if drops else ""))
    out.print(f"cost so far ${rep.spent_usd:.4f}; ledger {m.output_dir / 'ledger.sqlite'}")
    if rep.budget_stopped:
        err.print(
            f"[bold yellow]budget reached:[/] scheduling stopped before the next request "
            f"could pass budget_usd = {m.run.budget_usd}; raise it and rerun to continue"
        )
    if _report_failures(st, rep.datasets, manifest):
        raise typer.Exit(1)


def _report_failures(st: RunStatus, names: Any, manifest: Path) -> bool:
    """Print what failed for good; True when a dataset got no answer at all."""
    nothing = False
    for name in names:
        d = st.dataset(name)
        if not d.failed:
            continue
        reasons = sorted(d.errors.items(), key=lambda kv: -kv[1])[:3]
        why = ", ".join(f"{k} ({v} attempts)" for k, v in reasons)
        err.print(
            f"[bold yellow]{name}: {d.failed} of {d.total} failed after retries[/]"
            f" ({why}); `draftdata status {manifest}` has the details, and rerunning "
            "retries them",
            markup=True,
        )
        if d.done == 0:
            nothing = True
            if any(k.startswith(("connection_error", "timeout")) for k, _ in reasons):
                err.print(
                    "  nothing was answered: is the server at the backend's base_url "
                    "running and reachable?"
                )
    return nothing


@app.command()
def status(
    manifest: ManifestArg,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Counts by dataset and state, cost so far, error reasons."""
    from ..manifest import load_manifest
    from ..store.ledger import Ledger
    from ..store.stats import status as ledger_status

    m = load_manifest(manifest)
    path = m.output_dir / "ledger.sqlite"
    if not path.exists():
        raise InputError(f"{path}: no ledger yet; run `draftdata generate {manifest}` first")
    ledger = Ledger.read(path)
    try:
        st = ledger_status(ledger).to_json()
    finally:
        ledger.close()
    if json_out:
        sys.stdout.write(json.dumps(st, indent=2) + "\n")
        return
    t = Table(
        "dataset",
        "total",
        "done",
        "failed",
        "pending",
        "duplicates",
        "attempts",
        "samples",
        "cost $",
        "errors",
        title=f"run {m.run.name} ({path})",
    )
    for name, d in st["datasets"].items():
        t.add_row(
            name,
            str(d["total"]),
            str(d["done"]),
            str(d["failed"]),
            str(d["pending"]),
            str(d["duplicates"]),
            str(d["attempts"]),
            str(d["samples"]),
            f"{d['cost_usd']:.4f}",
            ", ".join(f"{k}: {v}" for k, v in sorted(d["errors"].items())),
        )
    out.print(t)
    out.print(f"cost so far ${st['cost_usd']:.4f}")


@app.command("replay-server")
def replay_server(
    records: Annotated[Path, typer.Argument(help="ground-truth JSONL to serve")],
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8000,
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    faults: Annotated[
        str | None,
        typer.Option(
            help="KIND=RATE,... with kinds 429, 500, slow, truncated, empty, length, reasoning, "
            "tools; e.g. '429=0.15,500=0.1,slow=0.05'"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="makes the fault choices reproducible")] = 0,
    token_ids: Annotated[
        bool, typer.Option("--token-ids", help="answer vLLM's return_token_ids with the exact ids")
    ] = False,
    slow_seconds: Annotated[float, typer.Option(help="delay of a 'slow' answer")] = 30.0,
) -> None:
    """Serve ground-truth records as an OpenAI-compatible chat-completions API (dry runs, tests)."""
    from ..devtools.replay import serve

    serve(records, host, port, faults, seed, token_ids, slow_seconds)


# --- the whole job ------------------------------------------------------------------------------
@app.command("run")
def run_cmd(
    manifest: ManifestArg,
    force: Annotated[
        bool,
        typer.Option("--force", help="override a failed validation gate (recorded in the export)"),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars")] = False,
) -> None:
    """Read -> generate -> tokens -> validate (gate) -> export -> report. Rerun to resume."""
    from ..manifest import load_manifest
    from ..pipeline import GateError, run_pipeline

    m = load_manifest(manifest)
    try:
        res = run_pipeline(m, force=force, quiet=quiet, console=err, command_line=command_line())
    except GateError:
        vpath = m.output_dir / "validation.json"
        if vpath.exists():
            print_validation(
                {
                    **json.loads(vpath.read_text()),
                    "format": m.target.format,
                    "format_version": "",
                    "prefs": m.target.prefs,
                }
            )
        raise
    g = res.gate
    if res.validation is not None and res.validation.meta.get("cross_validated"):
        out.print(
            f"learned {res.validation.meta['prefs_rules']} split preference(s) from the "
            f"ground truth ({m.output_dir / 'prefs.json'}); the figure below is "
            "cross-validated (learned on one half of the prompts, measured on the other)"
        )
    if res.validation is not None and res.validation.n:
        out.print(
            f"validation on ground truth: exact-match {res.validation.exact_match_rate:.1%}"
            f" ({res.validation.exact}/{res.validation.n}), token accuracy "
            f"{res.validation.token_accuracy:.4f}"
        )
    if g is not None:
        verdict = "passed" if g.passed else ("FORCED past a failed gate" if g.forced else "failed")
        out.print(f"gate (min_exact {g.min_exact}): {verdict}; {g.reason}")
    for name, d in res.datasets.items():
        drops = ", ".join(f"{k}: {v}" for k, v in d.drops.items())
        out.print(f"{name}: samples {d.samples or 0}" + (f"; dropped {drops}" if drops else ""))
    if res.budget_stopped:
        err.print(
            "[bold yellow]budget reached:[/] scheduling stopped before the next request "
            f"could pass budget_usd = {m.run.budget_usd}"
        )
    if res.export_dir is not None:
        out.print(f"shards and manifest: {res.export_dir}")
    _write_report(res.run_dir)
    from ..store.ledger import Ledger
    from ..store.stats import status as ledger_status

    led = Ledger.read(m.output_dir / "ledger.sqlite")
    try:
        st = ledger_status(led)
    finally:
        led.close()
    if _report_failures(st, res.datasets, manifest):
        raise typer.Exit(1)


def _write_report(run_dir: Path, out_path: Path | None = None) -> Path:
    from ..report import build_report, summary

    path = build_report(run_dir, out_path)
    out.print(summary(run_dir), markup=False, highlight=False)  # reasons may hold [ ] or <script>
    out.print(f"[bold]report[/] {path}", highlight=False)
    return path


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="the run folder (the manifest's [run] output)")],
    out_path: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="where to write the page (default RUN/report.html)"),
    ] = None,
) -> None:
    """Write a self-contained HTML report of a run and print its key figures."""
    _write_report(run, out_path)


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="the run's output folder (holds ledger.sqlite)")],
    as_: Annotated[
        list[str] | None,
        typer.Option(
            "--as",
            help="also write a trainer's format, repeatable: "
            + "; ".join(f"{e.name} ({e.summary})" for e in EXPORTERS.values()),
        ),
    ] = None,
) -> None:
    """Write Parquet shards + manifest.json from a run's ledger, and trainer-specific JSONL."""
    from ..export.run import export_run
    from ..export.trainers import export_as
    from ..generate.runner import Runner
    from ..manifest import manifest_of_run

    kinds = as_ or []
    for k in kinds:
        if k not in EXPORTERS:
            raise InputError(f"--as {k!r}: choose one of {', '.join(EXPORTERS)}")
    m = manifest_of_run(run)
    m.run.output = str(run.resolve())
    runner = Runner(m, quiet=True, console=err)
    try:
        folder = export_run(runner, _stored_validation(run), None)
        out.print(f"shards and manifest: {folder}")
        for k in kinds:
            out.print(f"{k}: {export_as(runner, k)}")
    finally:
        runner.ledger.close()


def _stored_validation(run: Path) -> dict[str, Any] | None:
    path = run / "validation.json"
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc
