"""The command layer: parse arguments, call the library, print, map errors to exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import DraftdataError, InputError

app = typer.Typer(
    name="draftdata",
    help="Token-exact training data for speculative-decoding drafters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, soft_wrap=True)

TokenizerOpt = Annotated[
    str,
    typer.Option(
        "--tokenizer",
        "-t",
        help="HF folder, tokenizer.json, tiktoken file, GGUF, or pkg:MODULE/path inside a package",
    ),
]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format", "-f", help="built-in format name (see `draftdata formats`) or a format .toml"
    ),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"draftdata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    pass


def read_jsonl(path: Path, counter: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; malformed lines are skipped and counted, never fatal."""
    try:
        f = path.open(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot open ({e.strerror}); check the path") from e
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if counter is not None:
                    counter["malformed_json"] = counter.get("malformed_json", 0) + 1
                    continue
                raise InputError(f"{path}:{lineno}: not valid JSON") from None
            if not isinstance(rec, dict):
                if counter is not None:
                    counter["not_an_object"] = counter.get("not_an_object", 0) + 1
                    continue
                raise InputError(f"{path}:{lineno}: expected a JSON object per line")
            yield rec


def _parse_expect(items: list[str]) -> dict[str, int]:
    outd: dict[str, int] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if not sep or not name:
            raise InputError(f"--expect {item!r}: write NAME=ID, e.g. --expect im_end=163586")
        try:
            outd[name] = int(value)
        except ValueError:
            raise InputError(f"--expect {item!r}: {value!r} is not an integer id") from None
    return outd


@app.command()
def formats() -> None:
    """List the built-in chat formats."""
    from .formats import BUILTIN

    t = Table("name", "version", "end of turn", "think", "tools", "description")
    for f in BUILTIN.values():
        think = (
            "-"
            if f.think is None
            else (
                f"{f.markers[f.think.open].text}…{f.markers[f.think.close].text}"
                + (" (prompt opens)" if f.think.prompt_opens else "")
            )
        )
        t.add_row(
            f.name,
            f.version,
            f.markers[f.end_of_turn].text,
            think,
            "yes" if f.supports_tools else "no",
            f.description,
        )
    out.print(t)


@app.command()
def audit(
    tokenizer: TokenizerOpt,
    format: FormatOpt = "chatml",
    data: Annotated[
        Path | None,
        typer.Option(help="JSONL with output_ids and finish_reason (real engine outputs)"),
    ] = None,
    expect: Annotated[
        list[str] | None,
        typer.Option(help="NAME=ID a constant your code relies on, e.g. im_end=163586; repeatable"),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="write the report as JSON to this file ('-' for stdout)"),
    ] = None,
    chat_template: Annotated[
        Path | None,
        typer.Option(help="a chat_template.jinja to use instead of the tokenizer's own"),
    ] = None,
) -> None:
    """Audit a tokenizer's special tokens against a chat format. Exits 1 when a check fails."""
    from .audit import audit as run_audit
    from .formats import get_format
    from .tokenizers import load_tokenizer

    expectations = _parse_expect(expect or [])
    tok = load_tokenizer(tokenizer, chat_template)
    fmt = get_format(format)
    skipped: dict[str, int] = {}
    records = list(read_jsonl(data, skipped)) if data else None
    report = run_audit(tok, fmt, expect=expectations, records=records)
    if json_out is not None:
        doc = json.dumps(report.to_json(), indent=2, ensure_ascii=False)
        if str(json_out) == "-":
            sys.stdout.write(doc + "\n")
        else:
            json_out.write_text(doc + "\n", encoding="utf-8")
    if json_out is None or str(json_out) != "-":
        _print_audit(report, skipped)
    if not report.ok:
        raise typer.Exit(1)


def _print_audit(report: Any, skipped: dict[str, int]) -> None:
    tk, fm = report.tokenizer, report.format
    out.print(
        f"[bold]tokenizer[/] {tk['path']} ({tk['kind']}, vocab {tk['vocab_size']:,}, "
        f"{tk['special_tokens']} special, {tk['added_tokens']} added, sha256 "
        f"{tk['sha256'][:12]}…)"
    )
    out.print(f"[bold]format[/] {fm['name']} v{fm['version']}: {fm['description']}")
    t = Table(
        "marker",
        "text",
        "id",
        "kind",
        "encodes to 1 id",
        "decodes back",
        "our encode keeps it text",
        "stock encode injects it from text",
        "verdict",
        title="markers",
    )
    yes = {True: "yes", False: "[red]no[/]"}
    for m in report.markers:
        t.add_row(
            m["name"],
            m["text"],
            str(m["id"]) if m["id"] is not None else "-",
            m["kind"],
            yes[m["encodes_to_one"]],
            yes[m["decodes_back"]],
            yes[m["text_stays_text"]],
            "[yellow]yes[/]" if m["stock_encode_matches_in_user_text"] else "no",
            "[green]ok[/]" if m["ok"] else f"[red]FAIL[/] {m['problem']}",
        )
    out.print(t)
    c = report.confusables
    if c["ordinary_lookalikes"]:
        t = Table("marker", "ordinary look-alike tokens", "examples", title="confusables")
        for mt, v in c["ordinary_lookalikes"].items():
            t.add_row(
                mt,
                str(v["count"]),
                ", ".join(f"{e['id']}:{e['text']!r}" for e in v["examples"][:6]),
            )
        out.print(t)
    if c["added_tokens_matched_in_text"]:
        names = ", ".join(
            f"{a['text']} ({a['id']})" for a in c["added_tokens_matched_in_text"][:10]
        )
        out.print(
            f"[yellow]added non-special tokens the stock encoder matches inside plain text "
            f"({len(c['added_tokens_matched_in_text'])}):[/] {names}"
        )
    if c["same_text_id_groups"]:
        ex = "; ".join(f"{g['text']!r}: {g['ids']}" for g in c["same_text_ids"][:5])
        out.print(
            f"[yellow]{c['same_text_id_groups']} groups of ids decode to the same text:[/] {ex}"
        )
    for m in c["markers_encoding_to_several_ids"]:
        out.print(
            f"[red]marker {m['name']} {m['text']!r} encodes to several ids {m['stock_ids']}[/]"
        )
    for e in report.expectations:
        out.print(("[green]expect ok[/] " if e.ok else "[red]expect FAIL[/] ") + e.message)
    d = report.data
    if d is not None:
        t = Table(
            "last token",
            "text",
            "kind",
            "count",
            "end of turn?",
            title=f"last token of {d.finished} finished outputs ({d.records} records, "
            f"{d.truncated} truncated)",
        )
        for h in d.last_token_histogram:
            t.add_row(
                str(h["id"]),
                repr(h["text"]),
                h["kind"],
                str(h["count"]),
                "yes" if h["is_end_of_turn"] else "[red]no[/]",
            )
        out.print(t)
        out.print(("[green]data ok[/] " if d.ok else "[red]data FAIL[/] ") + d.message)
        if d.truncated_ending_with_end:
            out.print(
                f"[yellow]{d.truncated_ending_with_end} truncated outputs end with the "
                "end-of-turn id[/]"
            )
    if skipped:
        out.print(f"[yellow]skipped input lines: {skipped}[/]")
    if report.ok:
        out.print("[bold green]PASS[/] every check passed")
    else:
        for f in report.failures:
            err.print(f"[bold red]FAIL[/] {f}")


def main() -> None:
    try:
        rv = app(standalone_mode=False)
    except DraftdataError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.exceptions.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    if isinstance(rv, int):
        sys.exit(rv)


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


def _bound(tokenizer: str, format: str, chat_template: Path | None = None, strict: bool = True):  # type: ignore[no-untyped-def]
    from .formats import get_format
    from .tokenizers import load_tokenizer

    return get_format(format).bind(load_tokenizer(tokenizer, chat_template), strict=strict)


def _applier(prefs: Path | None, bound: Any):  # type: ignore[no-untyped-def]
    if prefs is None:
        return None
    from .prefs import SplitPrefs

    p = SplitPrefs.load(prefs)
    p.check_tokenizer(bound.tokenizer, prefs)
    return p.applier(bound.tokenizer)


def _bucketed(records: list[dict[str, Any]], bucket: str | None) -> list[dict[str, Any]]:
    if bucket is None:
        return records
    from .prefs import _bucket
    from .validate import group_of

    try:
        lo_s, hi_s = bucket.split(":")
        lo, hi = float(lo_s), float(hi_s)
    except ValueError:
        raise InputError(f"--bucket {bucket!r}: write LO:HI with 0 <= LO < HI <= 1") from None
    if not 0 <= lo < hi <= 1:
        raise InputError(f"--bucket {bucket!r}: need 0 <= LO < HI <= 1")
    return [
        r
        for r in records
        if lo <= _bucket(group_of(r)) < hi or (hi == 1 and _bucket(group_of(r)) == 1)
    ]


def _print_skipped(skipped: dict[str, int]) -> None:
    if skipped:
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        err.print(f"[yellow]skipped input lines ({parts})[/]")


@app.command()
def reconstruct(
    input: Annotated[
        Path,
        typer.Argument(
            help="JSONL: messages (+tools) and api_view or a raw chat-completion response per line"
        ),
    ],
    tokenizer: TokenizerOpt,
    format: FormatOpt,
    output: Annotated[Path, typer.Option("-o", "--output", help="OUT.jsonl or OUT.parquet")],
    prefs: PrefsOpt = None,
    thinking: ThinkingOpt = None,
    chat_template: Annotated[Path | None, typer.Option(help="override the chat template")] = None,
) -> None:
    """Turn API text back into the model's exact token ids (input_ids + loss_mask)."""
    from rich.progress import track

    from .api import view_from_record
    from .errors import ReconstructError
    from .export import write_samples

    bound = _bound(tokenizer, format, chat_template)
    text_ids = _applier(prefs, bound)
    skipped: dict[str, int] = {}
    records = list(read_jsonl(input, skipped))
    samples = []
    drops: dict[str, int] = {}
    for i, rec in enumerate(
        track(records, description="reconstructing", console=err, disable=not sys.stderr.isatty())
    ):
        try:
            view = view_from_record(rec)
            if view is None:
                raise ReconstructError("record has neither api_view nor choices", "no_response")
            if not isinstance(rec.get("messages"), list):
                raise ReconstructError("record has no messages list", "no_messages")
            samples.append(_reconstruct_one(bound, rec, view, i, thinking, text_ids))
        except ReconstructError as e:
            drops[e.reason] = drops.get(e.reason, 0) + 1
        except InputError as e:
            drops[f"bad_record:{e}"] = drops.get(f"bad_record:{e}", 0) + 1
    write_samples(samples, output)
    by_source: dict[str, int] = {}
    for s in samples:
        by_source[s.token_source] = by_source.get(s.token_source, 0) + 1
    out.print(
        f"wrote {len(samples)} samples to {output} ({', '.join(f'{k}: {v}' for k, v in by_source.items()) or 'none'})"
    )
    if drops:
        err.print("[yellow]dropped: " + ", ".join(f"{k}: {v}" for k, v in drops.items()) + "[/]")
    _print_skipped(skipped)


def _reconstruct_one(
    bound: Any, rec: dict[str, Any], view: Any, i: int, thinking: bool | None, text_ids: Any
) -> Any:
    from .api import messages_of
    from .reconstruct import reconstruct as run

    return run(
        bound,
        messages_of(rec["messages"]),
        view,
        tools=rec.get("tools") or (),
        record_id=str(rec.get("id", i)),
        dataset=str(rec.get("source") or rec.get("dataset") or ""),
        thinking=thinking,
        text_ids=text_ids,
    )


@app.command()
def validate(
    input: Annotated[
        Path,
        typer.Argument(
            help="ground truth JSONL: messages, output_ids, "
            "finish_reason, and api_view (derived if missing)"
        ),
    ],
    tokenizer: TokenizerOpt,
    format: FormatOpt,
    prefs: PrefsOpt = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write the report as JSON ('-' for stdout)")
    ] = None,
    min_exact: Annotated[
        float | None,
        typer.Option(
            help="exit 1 when the exact-match rate is below this (the gate for paid runs)"
        ),
    ] = None,
    bucket: BucketOpt = None,
    thinking: ThinkingOpt = None,
    chat_template: Annotated[Path | None, typer.Option(help="override the chat template")] = None,
) -> None:
    """Reconstruct ground-truth records from their text and compare id for id."""
    from .validate import validate as run

    bound = _bound(tokenizer, format, chat_template, strict=False)
    for c in bound.checks:
        if not c.ok:
            err.print(
                f"[bold yellow]warning:[/] marker {c.name}: {c.problem} — measuring with "
                "the format as declared"
            )
    text_ids = _applier(prefs, bound)
    skipped: dict[str, int] = {}
    records = _bucketed(list(read_jsonl(input, skipped)), bucket)
    rep = run(bound, records, text_ids=text_ids, thinking=thinking)
    rep.meta = {
        "input": str(input),
        "format": bound.format.name,
        "format_version": bound.format.version,
        "tokenizer_sha256": bound.tokenizer.sha256,
        "prefs": str(prefs) if prefs else None,
        "bucket": bucket,
        "skipped_lines": skipped,
    }
    if rep.n == 0:
        raise InputError(f"{input}: no usable records (drops: {dict(rep.drops)})")
    doc = rep.to_json()
    if json_out is not None:
        text = json.dumps(doc, indent=2, ensure_ascii=False)
        if str(json_out) == "-":
            sys.stdout.write(text + "\n")
        else:
            json_out.write_text(text + "\n", encoding="utf-8")
    if json_out is None or str(json_out) != "-":
        _print_validation(doc)
    _print_skipped(skipped)
    if min_exact is not None and rep.exact_match_rate < min_exact:
        err.print(
            f"[bold red]GATE FAILED[/] exact-match {rep.exact_match_rate:.4f} < "
            f"--min-exact {min_exact}"
        )
        raise typer.Exit(1)


def _print_validation(doc: dict[str, Any]) -> None:
    t = Table(
        "source",
        "n",
        "exact",
        "exact-match",
        "token accuracy",
        "mismatches",
        title=f"reconstruction vs ground truth ({doc['format']} v{doc['format_version']}"
        + (f", prefs {doc['prefs']}" if doc.get("prefs") else "")
        + ")",
    )
    for s, v in doc["by_source"].items():
        t.add_row(
            s,
            str(v["n"]),
            str(v["exact"]),
            f"{v['exact_match_rate']:.1%}",
            f"{v['token_accuracy']:.4f}",
            ", ".join(f"{k} {n}" for k, n in sorted(v["categories"].items())),
        )
    t.add_row(
        "[bold]all[/]",
        str(doc["n"]),
        str(doc["exact"]),
        f"[bold]{doc['exact_match_rate']:.1%}[/]",
        f"[bold]{doc['token_accuracy']:.4f}[/]",
        ", ".join(f"{k} {n}" for k, n in sorted(doc["categories"].items())),
    )
    out.print(t)
    for cat, exs in doc["examples"].items():
        out.print(f"[bold]{cat}[/] ({doc['categories'][cat]})")
        for e in exs:
            out.print(f"  {e['id']} {e['where']} position {e['position']}: {e['text']!r}")
            out.print(f"    truth: {e['truth']}")
            out.print(f"    ours:  {e['ours']}")
    if doc["drops"]:
        out.print("[yellow]dropped: " + ", ".join(f"{k}: {v}" for k, v in doc["drops"].items()))
    out.print(f"token sources: {doc['token_sources']}")


@app.command()
def learn(
    input: Annotated[Path, typer.Argument(help="ground truth JSONL with exact output_ids")],
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
    from .prefs import learn as run
    from .validate import learning_pairs

    if not 0 < holdout < 1:
        raise InputError("--holdout must be between 0 and 1 (exclusive)")
    bound = _bound(tokenizer, format)
    skipped: dict[str, int] = {}
    records = _bucketed(list(read_jsonl(input, skipped)), bucket)
    pairs, drops = learning_pairs(bound, records, thinking)
    if not pairs:
        raise InputError(f"{input}: no usable ground-truth records (drops: {dict(drops)})")
    prefs = run(bound.tokenizer, pairs, holdout=holdout, min_support=min_support)
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
    tok = bound.tokenizer
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
    out.print(f"wrote {output}")
    _print_skipped(skipped)


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

    from .generate import Runner
    from .manifest import load_manifest

    m = load_manifest(manifest)
    runner = Runner(m, quiet=quiet, console=err)
    try:
        rep = asyncio.run(runner.run(dataset))
        st = runner.ledger.status()["datasets"]
    except KeyboardInterrupt:
        err.print(
            "interrupted: everything answered so far is in the ledger; run the same "
            "command again to resume"
        )
        raise typer.Exit(130) from None
    finally:
        runner.ledger.close()
    for name, d in rep.datasets.items():
        drops = ", ".join(f"{k}: {v}" for k, v in d["drops"].items())
        out.print(f"{name}: samples {d['samples'] or 0}" + (f"; dropped {drops}" if drops else ""))
    out.print(f"cost so far ${rep.spent_usd:.4f}; ledger {m.output_dir / 'ledger.sqlite'}")
    if rep.budget_stopped:
        err.print(
            f"[bold yellow]budget reached:[/] scheduling stopped before the next request "
            f"could pass budget_usd = {m.run.budget_usd}; raise it and rerun to continue"
        )
    if _report_failures(st, rep.datasets, manifest):
        raise typer.Exit(1)


def _report_failures(st: dict[str, Any], names: Any, manifest: Path) -> bool:
    """Print what failed for good; True when a dataset got no answer at all."""
    nothing = False
    for name in names:
        d = st.get(name, {})
        if not d.get("failed"):
            continue
        reasons = sorted(d.get("errors", {}).items(), key=lambda kv: -kv[1])[:3]
        why = ", ".join(f"{k} ({v} attempts)" for k, v in reasons)
        err.print(
            f"[bold yellow]{name}: {d['failed']} of {d['total']} failed after retries[/]"
            f" ({why}); `draftdata status {manifest}` has the details, and rerunning "
            "retries them"
        )
        if d.get("done", 0) == 0:
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
    from .ledger import Ledger
    from .manifest import load_manifest

    m = load_manifest(manifest)
    path = m.output_dir / "ledger.sqlite"
    if not path.exists():
        raise InputError(f"{path}: no ledger yet; run `draftdata generate {manifest}` first")
    ledger = Ledger(path)
    try:
        st = ledger.status()
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
    from .replay import serve

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
    from .manifest import load_manifest
    from .pipeline import GateError, run_pipeline

    m = load_manifest(manifest)
    try:
        res = run_pipeline(m, force=force, quiet=quiet, console=err)
    except GateError:
        vpath = m.output_dir / "validation.json"
        if vpath.exists():
            _print_validation(
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
        drops = ", ".join(f"{k}: {v}" for k, v in d["drops"].items())
        out.print(f"{name}: samples {d['samples'] or 0}" + (f"; dropped {drops}" if drops else ""))
    if res.budget_stopped:
        err.print(
            "[bold yellow]budget reached:[/] scheduling stopped before the next request "
            f"could pass budget_usd = {m.run.budget_usd}"
        )
    if res.export_dir is not None:
        out.print(f"shards and manifest: {res.export_dir}")
    report_path = _try_report(res.run_dir)
    if report_path is not None:
        out.print(f"report: {report_path}")
    from .ledger import Ledger

    led = Ledger(m.output_dir / "ledger.sqlite")
    try:
        st = led.status()["datasets"]
    finally:
        led.close()
    if _report_failures(st, res.datasets, manifest):
        raise typer.Exit(1)


def _try_report(run_dir: Path) -> Path | None:
    from .report import build_report, summary

    path = build_report(run_dir)
    out.print(summary(run_dir), markup=False, highlight=False)  # reasons may hold [ ] or <script>
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
    from .report import build_report, summary

    path = build_report(run, out_path)
    out.print(summary(run), markup=False, highlight=False)
    out.print(f"[bold]report[/] {path}", highlight=False)


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="the run's output folder (holds ledger.sqlite)")],
    as_: Annotated[
        list[str] | None,
        typer.Option(
            "--as",
            help="also write trainer JSONL: specforge (conversations with reasoning), "
            "speculators (input_ids + loss_mask); repeatable",
        ),
    ] = None,
) -> None:
    """Write Parquet shards + manifest.json from a run's ledger, and trainer-specific JSONL."""
    from .generate import Runner
    from .ledger import Ledger
    from .manifest import manifest_of_run
    from .pipeline import export_run, export_trainer

    kinds = as_ or []
    for k in kinds:
        if k not in ("specforge", "speculators"):
            raise InputError(f"--as {k!r}: choose specforge or speculators")
    m = manifest_of_run(run)
    m.run.output = str(run.resolve())
    runner = Runner(m, quiet=True, console=err)
    try:
        led: Ledger = runner.ledger
        folder = export_run(runner, _stored_validation(run), None)
        out.print(f"shards and manifest: {folder}")
        for k in kinds:
            out.print(f"{k}: {export_trainer(runner, k)}")
    finally:
        led.close()


def _stored_validation(run: Path) -> dict[str, Any] | None:
    path = run / "validation.json"
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc
