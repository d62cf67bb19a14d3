"""Progress while generating: one bar per dataset with answers, rate, tokens, errors and cost on a
terminal; without one (logs, CI) or with --quiet, one plain line per dataset every few seconds.
Rates are over this session's wall time, and only once there is enough of it to mean something."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.text import Text


@dataclass
class Meter:
    total: int
    done: int = 0
    errors: int = 0
    tokens: int = 0
    cost: float = 0.0
    started: float = field(default_factory=time.monotonic)
    #: answers that were already in the ledger when this session started (not this session's rate)
    resumed: int = 0


#: below this many seconds or answers a rate is noise ("746.7 req/s" for a 2.5 s run)
MIN_RATE_S = 5.0
MIN_RATE_N = 10


def rate(n: int, seconds: float) -> float | None:
    return n / seconds if seconds >= MIN_RATE_S and n >= MIN_RATE_N else None


def eta(remaining: int, per_s: float | None) -> str:
    if per_s is None or per_s <= 0:
        return "–"
    s = int(remaining / per_s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def line(name: str, m: Meter, now: float) -> str:
    """One progress line: done/total, rate over this session's wall time, errors, cost, ETA."""
    dt = now - m.started
    r = rate(m.done - m.resumed, dt)
    pct = f" ({m.done / m.total:.0%})" if m.total else ""
    speed = f"{r:.1f} req/s" if r is not None else "rate –"
    return (
        f"{name}: {m.done}/{m.total}{pct} · {speed} over {dt:.0f} s · errors {m.errors} · "
        f"${m.cost:.4f} · ETA {eta(m.total - m.done, r)}"
    )


class Bars:
    def __init__(self, quiet: bool, console: Console | None = None, every_s: float = 30.0) -> None:
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        #: plain lines instead of bars: no terminal, or --quiet; 0 turns them off
        self.every_s = every_s if (quiet or not self.console.is_terminal) else 0.0
        self._last_line: dict[str, float] = {}
        self._notes: dict[str, float] = {}
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[rps]:.1f} req/s {task.fields[tps]:.0f} tok/s"),
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("${task.fields[cost]:.4f}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=quiet or not self.console.is_terminal,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}
        self.meters: dict[str, Meter] = {}

    def __enter__(self) -> Bars:
        self.progress.__enter__()
        return self

    def __exit__(self, *a: Any) -> None:
        self.progress.__exit__(*a)

    def add(self, name: str, total: int, done: int) -> None:
        self.meters[name] = Meter(total, done, resumed=done)
        if self.every_s > 0:
            self._last_line[name] = time.monotonic()
            self._say(line(name, self.meters[name], time.monotonic()))
        self.tasks[name] = self.progress.add_task(
            name, total=total, completed=done, rps=0.0, tps=0.0, errors=0, cost=0.0
        )

    def update(
        self, name: str, *, done: int = 0, errors: int = 0, tokens: int = 0, cost: float = 0.0
    ) -> None:
        m = self.meters[name]
        m.done += done
        m.errors += errors
        m.tokens += tokens
        m.cost += cost
        now = time.monotonic()
        dt = now - m.started
        self.progress.update(
            self.tasks[name],
            completed=m.done,
            rps=rate(m.done - m.resumed, dt) or 0.0,
            tps=m.tokens / dt if dt >= MIN_RATE_S else 0.0,
            errors=m.errors,
            cost=m.cost,
        )
        if self.every_s > 0 and (
            now - self._last_line.get(name, 0.0) >= self.every_s or m.done == m.total
        ):
            self._last_line[name] = now if m.done < m.total else float("inf")
            self._say(line(name, m, now))

    def note(self, text: str) -> None:
        """A line about the run (a long wait, a stop), once per distinct text a minute."""
        now = time.monotonic()
        if now - self._notes.get(text, 0.0) >= 60:
            self._notes[text] = now
            self._say(text)

    def _say(self, text: str) -> None:
        self.console.print(Text(text), soft_wrap=True)
