"""One progress line for long loops, shared by the CLI commands and the pipeline's gate."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console


class Ticker:
    """A progress line on ``console`` (stderr by default) for long loops: every ``every``
    seconds, and once at the end."""

    def __init__(
        self,
        what: str,
        total: int | None,
        every: float = 15.0,
        console: Console | None = None,
        unit: str = "records",
    ) -> None:
        self.what, self.total, self.every, self.unit = what, total, every, unit
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.done = self.exact = 0
        #: whether the results counted carry an ``exact`` figure (validation does, scoring not)
        self.counts_exact = False
        self._clock = time.monotonic
        self.start = self._last = self._clock()

    def elapsed(self) -> float:
        return self._clock() - self.start

    def tick(self, result: Any = None) -> None:
        if hasattr(result, "exact"):
            self.counts_exact = True
            self.exact += bool(result.exact)
        self.advance(1)

    def advance(self, n: int) -> None:
        """``n`` more records done (a worker's chunk)."""
        self.done += n
        now = self._clock()
        if now - self._last >= self.every or self.done == self.total:
            self._last = now
            rate = self.done / max(now - self.start, 1e-9)
            if self.total is None:  # a stream: how far, how fast
                self.console.print(
                    f"{self.what}: {self.done} {self.unit}, {rate:.1f}/s", highlight=False
                )
                return
            left = (self.total - self.done) / rate if rate else 0
            exact = f"{self.exact} exact so far, " if self.counts_exact else ""
            self.console.print(
                f"{self.what}: {self.done}/{self.total} {self.unit}, {exact}"
                f"{rate:.1f}/s, about {left:.0f} s left",
                highlight=False,
            )
