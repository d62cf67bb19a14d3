"""Printing shared by command groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape as esc
from rich.table import Table

from .app import err, out, say


def _pct(x: float | None, nothing: str = "nothing measured") -> str:
    return nothing if x is None else f"{x:.1%}"


def _acc(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def print_validation(doc: dict[str, Any]) -> None:
    out.print(_validation_table(doc))
    if doc.get("lossy"):
        _print_lossy(doc)
    for cat, exs in doc["examples"].items():
        out.print(f"[bold]{esc(cat)}[/] ({doc['categories'][cat]})")
        for e in exs:
            say(out, f"  {e['id']} {e['where']} position {e['position']}: {e['text']!r}")
            say(out, f"    truth: {e['truth']}")
            say(out, f"    ours:  {e['ours']}")
    if doc["drops"]:
        out.print("[yellow]dropped: " + ", ".join(f"{k}: {v}" for k, v in doc["drops"].items()))
    say(out, f"token sources: {doc['token_sources']}")
    by_dec = doc.get("by_decoding") or {}
    if len(by_dec) > 1 or "unknown" not in by_dec:
        say(
            out,
            "by decoding: "
            + ", ".join(
                f"{k} {v['exact']}/{v['n']} ({v['exact_match_rate']:.1%})"
                for k, v in by_dec.items()
            ),
        )
    rp = doc.get("repair")
    if rp:
        _print_repair(doc, rp)


def _validation_table(doc: dict[str, Any]) -> Table:
    """One row per token source, then all of them: exact matches, accuracy, mismatch kinds."""
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
            _pct(v["exact_match_rate"]),
            _acc(v["token_accuracy"]),
            ", ".join(f"{k} {n}" for k, n in sorted(v["categories"].items())),
        )
    t.add_row(
        "[bold]all[/]",
        str(doc["n"]),
        str(doc["exact"]),
        f"[bold]{_pct(doc['exact_match_rate'])}[/]",
        f"[bold]{_acc(doc['token_accuracy'])}[/]",
        ", ".join(f"{k} {n}" for k, n in sorted(doc["categories"].items())),
    )
    return t


def _print_lossy(doc: dict[str, Any]) -> None:
    """Views the server lost text of: how often the format's guess held, and the rate over the
    lossless views beside the gate's figure over all."""
    held = ", ".join(
        f"{k.removeprefix('lossy:')} held {t['held']} of {t['views']}"
        for k, t in sorted((doc.get("lossy_labels") or {}).items())
    )
    lossless = (
        f"over the {doc['lossless']} lossless views [bold]{doc['lossless_exact_match_rate']:.1%}[/]"
        if doc.get("lossless_exact_match_rate") is not None
        else "no lossless views to measure"
    )
    out.print(
        f"{doc['lossy']} of {doc['n']} views lost text at the server; the format's guess, "
        f"checked on the truth: {esc(held)}. Ids equal over all {doc['n']} views "
        f"[bold]{_pct(doc['exact_match_rate'])}[/] (the gate's figure); {lossless}"
    )


def _print_repair(doc: dict[str, Any], rp: dict[str, Any]) -> None:
    """--repair-with: the figures before and after the repair, what it fixed and broke, its
    bets between two spellings, and the model's time."""
    b = rp["before"]
    say(
        out,
        f"repair with {doc.get('repair_with')}: exact {b['exact']} -> {doc['exact']} "
        f"({_pct(b['exact_match_rate'])} -> {_pct(doc['exact_match_rate'])}), token accuracy "
        f"{_acc(b['token_accuracy'])} -> {_acc(doc['token_accuracy'])}; fixed {rp['fixed']}, "
        f"broken {rp['broken']}, unchanged {rp['unchanged_exact']} exact + "
        f"{rp['unchanged_wrong']} not; {rp['repairs']} repairs in "
        f"{rp['samples_repaired']} samples",
    )
    if rp.get("bets"):
        say(
            out,
            f"  {rp['bets']} of the repairs chose the likelier of two spellings the model "
            f"could both have drawn: about {rp['bets_expected_wrong']:.2f} expected wrong "
            "by the model's own odds",
        )
    for why, n in (rp.get("unrepaired") or {}).items():
        say(err, f"  {n} sample(s) could not be repaired, measured as reconstructed: {why}")
    if doc.get("tokens_per_s"):
        say(
            out,
            f"model time: {doc['seconds']} s, {doc['tokens_per_s']} tokens/s, "
            f"{rp['tokens_forwarded'] / max(rp['tokens'], 1):.3f}x the tokens of one "
            "forward pass",
        )


def verify_export_cmd(run: Path, json_out: bool) -> None:
    """`export --verify`: RUN/export against its manifest; exit 1 where it is not whole."""
    import json
    import sys

    import typer

    from ..errors import InputError
    from ..export.sealed import verify_export

    folder = run / "export"
    if not (folder / "manifest.json").is_file():
        raise InputError(f"{folder}: no export to verify; run `draftdata export {run}` first")
    c = verify_export(folder)
    what = f"export of {c.created_at}: {c.checked} files" + (
        f" (trainers: {', '.join(c.trainers)})" if c.trainers else ""
    )
    if json_out:
        doc = {"export": str(folder.resolve()), "created_at": c.created_at, "files": c.checked,
               "trainers": list(c.trainers), "ok": c.ok, "problems": c.problems}  # fmt: skip
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif c.ok:
        say(out, f"{folder}: whole, the {what}, each of the size and sha256 listed")
    else:
        say(out, f"{folder}: NOT whole, the {what}: " + "; ".join(c.problems), "bold red")
    if not c.ok:
        raise typer.Exit(1)
