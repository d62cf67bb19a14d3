"""CLI commands for generation and the whole job: generate, status, replay-server, run,
report, export."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import InputError
from ..export.trainers import EXPORTERS
from .app import app, command_line, err, example, out, say
from .failures import report_failures
from .ledger_view import counts_line, print_status_notes, read_status, status_table
from .show import print_validation, verify_export_cmd

if TYPE_CHECKING:
    from ..config import Manifest
    from ..pipeline import PipelineResult
    from ..records import Key
    from ..store.stats import RunStatus

ManifestArg = Annotated[Path, typer.Argument(help="the run manifest (TOML)", metavar="MANIFEST")]
RunArg = Annotated[
    Path, typer.Argument(help="the run folder (the manifest's [run] output)", metavar="RUN")
]
QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="no progress bars; still a progress line every --progress-every s"
    ),
]
EveryOpt = Annotated[
    float,
    typer.Option(
        help="seconds between progress lines when there are no bars (logs, CI, --quiet); "
        "0 turns them off"
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the outcome as JSON on stdout")]
ExtendOpt = Annotated[
    bool,
    typer.Option(
        "--extend", help="a dataset's limit grew: keep its answers and ask only for new prompts"
    ),
]


def _json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")


# --- generation -------------------------------------------------------------------------------
@app.command(
    epilog=example(
        "draftdata generate examples/demo/manifest.toml",
        "draftdata generate manifest.toml -d sharegpt --quiet --progress-every 60",
    )
)
def generate(
    manifest: ManifestArg,
    dataset: Annotated[
        list[str] | None, typer.Option("--dataset", "-d", help="only this dataset (repeatable)")
    ] = None,
    quiet: QuietOpt = False,
    progress_every: EveryOpt = 30.0,
    json_out: JsonOpt = False,
    extend: ExtendOpt = False,
) -> None:
    """Generate answers into the run's ledger and make samples. Resume: run it again."""
    from ..config import load_manifest
    from ..generate.runner import RunReport
    from ..pipeline import GENERATE, run_pipeline

    m = load_manifest(manifest)
    staged = run_pipeline(
        m,
        quiet=quiet,
        console=err,
        command_line=command_line(),
        progress_every=progress_every,
        extend=extend,
        stages=GENERATE,
        only=dataset,
    )
    rep = staged.report or RunReport()
    rep.datasets = staged.result.datasets
    st, failed = _ledger_outcome(m.output_dir / "ledger.sqlite")
    if json_out:
        _json(
            {
                "datasets": {
                    k: {"samples": v.samples, "drops": v.drops} for k, v in rep.datasets.items()
                },
                "spent_usd": rep.spent_usd,
                "budget_stopped": rep.budget_stopped,
                "status": st.to_json(),
            }
        )
    else:
        _print_datasets(rep.datasets)
        say(out, f"cost so far ${rep.spent_usd:.4f}; ledger {m.output_dir / 'ledger.sqlite'}")
    if rep.budget_stopped:
        say(
            err,
            "budget reached: scheduling stopped before the next request could pass "
            f"budget_usd = {m.run.budget_usd}; raise it and rerun to continue",
            "bold yellow",
        )
    for name, why in rep.stopped.items():
        say(err, f"{name} stopped: {why}", "bold red")
    if report_failures(st, rep.datasets, manifest, failed) or rep.stopped:
        raise typer.Exit(1)


def _print_datasets(datasets: dict[str, Any]) -> None:
    for name, d in datasets.items():
        drops = ", ".join(f"{k} {v}" for k, v in d.drops.items())
        made = ", ".join(f"{k} {v}" for k, v in d.samples.items())
        line = f"{name}: {sum(d.samples.values())} samples" + (f" ({made})" if made else "")
        say(out, line + (f"; dropped {drops}" if drops else ""))


@app.command(
    epilog=example(
        "draftdata status examples/demo/manifest.toml",
        "draftdata status manifest.toml --json",
        "draftdata status manifest.toml --failed",
    )
)
def status(
    manifest: ManifestArg,
    json_out: JsonOpt = False,
    failed: Annotated[
        bool,
        typer.Option(
            "--failed", help="list every key that failed, was quarantined or dropped, with why"
        ),
    ] = False,
) -> None:
    """Counts by dataset and state, cost so far, error reasons."""
    from ..config import load_manifest

    m = load_manifest(manifest)
    path = m.output_dir / "ledger.sqlite"
    if not path.exists():
        raise InputError(f"{path}: no ledger yet; run `draftdata generate {manifest}` first")
    run_status, st, bad = read_status(path, failed)
    if failed:
        rows = [{"key": k.sample_id, "state": state, "reason": why} for k, state, why in bad]
        if json_out:
            _json(rows)
        else:
            for r in rows:
                say(out, f"{r['key']}  {r['state']}  {r['reason']}")
            say(out, f"{len(rows)} keys failed, quarantined or dropped")
        return
    if json_out:
        _json(st)
        return
    out.print(status_table(m.run.name, path, st))
    print_status_notes(run_status, st)


@app.command(
    "replay-server",
    epilog=example(
        "draftdata replay-server ../shared/data/groundtruth/smollm2-135m-instruct.dev.jsonl",
        "draftdata replay-server gt.jsonl --port 8001 --token-ids --faults '429=0.1,500=0.05'",
    ),
)
def replay_server(
    records: Annotated[Path, typer.Argument(help="ground-truth JSONL to serve", metavar="GT")],
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 8000,
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    faults: Annotated[
        str | None,
        typer.Option(
            help="KIND=RATE,... with kinds 429, 500, 401, 403 (statuses; 401 and 403 hit a "
            "record on every attempt), slow, slowbody (only on attempt 1), truncated, cut "
            "(connection closed mid-body), empty, length, reasoning, tools, badtools, strmessage, "
            "nousage, overlong, huge (a 16 MiB answer); e.g. '429=0.15,500=0.1,slow=0.05'"
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
@app.command(
    "run",
    epilog=example(
        "draftdata run examples/demo/manifest.toml",
        "draftdata run manifest.toml --quiet --progress-every 60 --json > outcome.json",
        "draftdata run manifest.toml --force   # past a failed gate (recorded in the export)",
    ),
)
def run_cmd(
    manifest: ManifestArg,
    force: Annotated[
        bool,
        typer.Option("--force", help="override a failed validation gate (recorded in the export)"),
    ] = False,
    quiet: QuietOpt = False,
    progress_every: EveryOpt = 30.0,
    json_out: JsonOpt = False,
    extend: ExtendOpt = False,
) -> None:
    """Read -> generate -> tokens -> validate (gate) -> export -> report. Rerun to resume."""
    from ..config import load_manifest
    from ..pipeline import GateError, run_pipeline

    m = load_manifest(manifest)
    try:
        res = run_pipeline(
            m,
            force=force,
            quiet=quiet,
            console=err,
            command_line=command_line(),
            progress_every=progress_every,
            extend=extend,
        ).result
    except GateError:
        _print_stored_validation(m)
        raise
    st, failed = _ledger_outcome(m.output_dir / "ledger.sqlite")
    if json_out:
        _json(_outcome_json(res, st))
    else:
        _print_outcome(m, res)
    if res.budget_stopped:
        say(
            err,
            "budget reached: scheduling stopped before the next request could pass "
            f"budget_usd = {m.run.budget_usd}",
            "bold yellow",
        )
    for name, why in res.stopped.items():
        say(err, f"{name} stopped: {why}", "bold red")
    if report_failures(st, res.datasets, manifest, failed) or res.stopped:
        raise typer.Exit(1)


def _print_stored_validation(m: Manifest) -> None:
    """A failed gate: the validation that failed it, as the run stored it, where it did."""
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


def _ledger_outcome(path: Path) -> tuple[RunStatus, list[tuple[Key, str, str]]]:
    """The ledger at ``path`` after the run: its status, and every key that failed."""
    from ..store.ledger import Ledger
    from ..store.stats import status as ledger_status

    led = Ledger.read(path)
    try:
        st = ledger_status(led)
        failed = led.answers.failed()
    finally:
        led.close()
    return st, failed


def _outcome_json(res: PipelineResult, st: RunStatus) -> dict[str, Any]:
    """``run --json``: the gate, the validation, each dataset's samples and drops, where the
    export and the report went, and the ledger's status (the report is written here)."""
    from ..report import build_report

    g, v = res.gate, res.validation
    return {
        "gate": g.to_json() if g else None,
        "gate_verdict": g.verdict() if g else None,
        "validation": v.to_json() if v is not None else None,
        "datasets": {k: {"samples": d.samples, "drops": d.drops} for k, d in res.datasets.items()},
        "budget_stopped": res.budget_stopped,
        "stopped": res.stopped,
        "counting": res.counting,
        "export": str(res.export_dir) if res.export_dir else None,
        "report": str(build_report(res.run_dir)),
        "status": st.to_json(),
    }


def _print_outcome(m: Manifest, res: PipelineResult) -> None:
    """What the run did: the validation and the gate's verdict, each dataset's samples, the
    export, then the report written and its key figures."""
    g, v = res.gate, res.validation
    if v is not None and v.meta.get("cross_validated"):
        say(
            out,
            f"learned {v.meta['prefs_rules']} split preference(s) from the ground truth "
            f"({m.output_dir / 'prefs.json'}); the figure below is cross-validated "
            "(learned on one half of the prompts, measured on the other)",
        )
    if v is not None and v.n:
        lossy = ""
        if v.lossy:
            lossless = (
                f"{v.lossless_exact}/{v.lossless} lossless"
                if v.lossless
                else "no lossless views to measure"
            )
            lossy = f"; {lossless}; lost at the server, guessed back: {v.held_summary()}"
        say(
            out,
            f"validation on ground truth: exact-match {v.exact_match_rate or 0:.1%} "
            f"({v.exact}/{v.n}), token accuracy {v.token_accuracy or 0:.4f}{lossy}",
        )
    if g is not None:
        say(out, g.verdict(), None if g.passed else "bold yellow")
    _print_datasets(res.datasets)
    if res.export_dir is not None:
        say(out, f"shards and manifest: {res.export_dir}")
    _write_report(res.run_dir)


def _write_report(run_dir: Path, out_path: Path | None = None) -> Path:
    from ..report import build_report, summary

    path = build_report(run_dir, out_path)
    say(out, summary(run_dir))  # reasons may hold [ ] or <script>: printed as they are
    say(out, f"report {path}")
    return path


@app.command(
    epilog=example("draftdata report runs/demo", "draftdata report runs/demo -o /tmp/demo.html")
)
def report(
    run: RunArg,
    out_path: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="where to write the page (default RUN/report.html)"),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="print the page's path and key figures as JSON")
    ] = False,
) -> None:
    """Write a self-contained HTML report of a run and print its key figures."""
    if json_out:
        from ..report import build_report, summary

        path = build_report(run, out_path)
        _json({"report": str(path), "summary": summary(run).splitlines()})
        return
    _write_report(run, out_path)


@app.command(
    epilog=example(
        "draftdata export runs/demo",
        "draftdata export runs/demo --as speculators --as specforge",
    )
)
def export(
    run: RunArg,
    as_: Annotated[
        list[str] | None,
        typer.Option(
            "--as",
            help="also write a trainer's format, repeatable: "
            + "; ".join(f"{e.name} ({e.summary})" for e in EXPORTERS.values()),
        ),
    ] = None,
    drop: Annotated[
        list[str] | None,
        typer.Option(
            "--drop",
            help="leave out samples a filter fits, comma-separated or repeated: a quality "
            "check (repetition_loop, truncated, empty_answer, think_unclosed, "
            "near_duplicate_answer, language_mismatch) or contaminated",
        ),
    ] = None,
    json_out: JsonOpt = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="write nothing: check RUN/export against its manifest (every file's size and "
            "sha256) and say which export it is; exit 1 where it is not whole",
        ),
    ] = False,
) -> None:
    """Write Parquet shards + manifest.json from a run's ledger, and trainer-specific files."""
    if verify:
        verify_export_cmd(run, json_out)
        return
    from ..export.filters import parse_drop
    from ..export.run_export import StoredValidation, export_as, export_run
    from ..export.trainers.settings import export_notes
    from ..export.write import read_export_manifest
    from ..session import Run
    from ..store.runs import manifest_of_run

    for k in (kinds := as_ or []):
        if k not in EXPORTERS:
            raise InputError(f"--as {k!r}: choose one of {', '.join(EXPORTERS)}")
    filters = parse_drop(drop or [])
    m = manifest_of_run(run)
    m.run.output = str(run.resolve())
    # a reading command: no lock (it runs beside a writer), and nothing of the run's own record
    # (its command line, manifest, requests in flight) is written
    with Run.open(m, write=False) as s:
        valid = StoredValidation.read(run / "validation.json")
        folder = export_run(s.ledger, m, s.target, valid, None, drop=filters, kinds=kinds)
        at = (s.ledger, m, s.target.bound)  # what a trainer's export reads of the run
        files = {k: [str(p) for p in export_as(*at, k, filters)] for k in kinds}
    em = read_export_manifest(folder)
    if json_out:
        _json(
            {"export": str(folder), "samples": em.samples, "files": files, "filtered": em.filtered}
        )
        return
    say(out, f"shards and manifest: {folder}")
    for name, per in em.filtered.items():
        say(out, f"{name}: left out by --drop: {counts_line(per)}")
    for k, paths in files.items():
        say(out, f"{k}: {', '.join(paths)}")
        for line in export_notes(k, paths):
            say(out, line)
        if EXPORTERS[k].lossy:
            say(err, f"warning: {k} is lossy, {EXPORTERS[k].lossy}")
