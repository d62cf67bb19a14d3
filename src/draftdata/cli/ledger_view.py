"""What ``draftdata status`` shows of a run's ledger: the counts read under one guard, the table
by dataset, and each dataset's notes below it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from .app import out, say

if TYPE_CHECKING:
    from ..records import Key
    from ..store.stats import RunStatus


def counts_line(counts: dict[str, int]) -> str:
    """``reason: n`` pairs, most first."""
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def read_status(
    path: Path, failed: bool
) -> tuple[RunStatus, dict[str, Any], list[tuple[Key, str, str]]]:
    """The ledger at ``path`` read once: its status, that status as JSON with each dataset's
    drops when read added, and (with ``failed``) every key that failed, with why."""
    from ..store.guard import reading
    from ..store.ledger import Ledger
    from ..store.meta import READ_DROPS
    from ..store.stats import status as ledger_status

    ledger = Ledger.read(path)
    try:
        with reading(path):  # a damaged page the open did not touch
            run_status = ledger_status(ledger)
            st = run_status.to_json()
            for name, d in st["datasets"].items():  # dropped when read (contaminated, ...)
                d["read_drops"] = ledger.meta.get(READ_DROPS.of(name), {})
            bad = ledger.answers.failed() if failed else []
    finally:
        ledger.close()
    return run_status, st, bad


def status_table(run: str, path: Path, st: dict[str, Any]) -> Table:
    """One row per dataset of the status JSON ``st``: its keys by state, samples, cost, errors."""
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
        title=f"run {run} ({path})",
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
    return t


def print_status_notes(run_status: RunStatus, st: dict[str, Any]) -> None:
    """Below the table: each dataset's drops, warnings, server options, usage not taken as sent
    and requests caught in flight by an interrupt; then the cost so far."""
    for name, ds in run_status.datasets.items():
        for what, counts in (
            ("dropped when read", st["datasets"][name]["read_drops"]),
            ("dropped by the tokens stage", ds.drops),
            ("sample warnings", ds.warnings),
        ):
            if counts:
                say(out, f"{name}: {what}: " + counts_line(counts))
        for line in ds.server_options.lines() if ds.server_options else ():
            say(out, f"{name}: {line}")
        notes = dict(ds.usage_notes)
        if missing := notes.pop("missing", 0):
            say(
                out,
                f"{name}: {missing} answers came with no token counts: their ids are checked "
                "by their text only, not against the server's counts (a [model] repair checks "
                "them against the target)",
            )
        if notes:
            why = ", ".join(f"{n} {k}" for k, n in sorted(notes.items()))
            say(
                out,
                f"{name}: the server's usage was not taken as sent for {why} answers "
                "(charged draftdata's own count of their tokens)",
            )
        if ds.interrupted or ds.unanswered or ds.in_flight:
            say(
                out,
                f"{name}: {ds.interrupted} requests were in flight at an interrupt and "
                f"{ds.unanswered} were sent and never answered (timed out or cut): possibly "
                f"paid, up to ${ds.possibly_paid_usd:.4f}, counted against the budget, and "
                f"asked again; {ds.in_flight} in flight now",
            )
    possibly = sum(d.possibly_paid_usd for d in run_status.datasets.values())
    say(
        out,
        f"cost so far ${st['cost_usd']:.4f}"
        + (
            f" (+ up to ${possibly:.4f} possibly paid: requests never answered)" if possibly else ""
        ),
    )
