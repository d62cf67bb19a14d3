"""Progress while generating: one bar per dataset with answers, rate, tokens, errors and cost."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn


@dataclass
class Meter:
    total: int
    done: int = 0
    errors: int = 0
    tokens: int = 0
    cost: float = 0.0
    started: float = field(default_factory=time.time)
    #: answers that were already in the ledger when this session started (not this session's rate)
    resumed: int = 0


class Bars:
    def __init__(self, quiet: bool, console: Console | None = None) -> None:
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[rps]:.1f} req/s {task.fields[tps]:.0f} tok/s"),
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("${task.fields[cost]:.4f}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=quiet,
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
        dt = max(time.time() - m.started, 1e-6)
        self.progress.update(
            self.tasks[name],
            completed=m.done,
            rps=(m.done - m.resumed) / dt,
            tps=m.tokens / dt,
            errors=m.errors,
            cost=m.cost,
        )
