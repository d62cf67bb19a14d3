"""Requests in flight: each is written before it is sent and closed by the transaction that
records its outcome, so one left open by a kill or Ctrl-C is known to the next writer, counted
as possibly paid and asked again. A mixin of :class:`~draftdata.store.ledger.Ledger`."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from ..records import Key

#: the reason of an attempt that was in flight when its run was interrupted (possibly paid)
INTERRUPTED = "interrupted"
_KEY = "dataset=? AND prompt_id=? AND sample_idx=? AND turn=?"


class InflightMixin:
    db: sqlite3.Connection

    def tx(self) -> Any:
        raise NotImplementedError

    def _attempt(self, key: Key, backend: str, ok: bool, reason: str | None, *rest: Any) -> int:
        raise NotImplementedError

    def begin(self, intents: Sequence[tuple[Key, str, float]]) -> list[int]:
        """Requests about to be sent, each (key, backend, what it may cost), written before
        they are: one still here when the run stops was in flight at an interrupt
        (``settle_interrupted``). Returns each row's id, which its outcome carries."""
        now = time.time()
        with self.tx():
            return [
                int(
                    self.db.execute(
                        "INSERT INTO inflight (dataset, prompt_id, sample_idx, turn, backend, "
                        "started_at, estimate_usd) VALUES (?,?,?,?,?,?,?)",
                        (*key.tuple(), backend, now, estimate),
                    ).lastrowid
                    or 0
                )
                for key, backend, estimate in intents
            ]

    def _end(self, intent: int | None) -> None:
        if intent is not None:
            self.db.execute("DELETE FROM inflight WHERE id=? AND state='open'", (intent,))

    def settle_interrupted(self) -> tuple[int, float]:
        """Requests written by ``begin`` whose outcome never was (the process was killed or
        interrupted while they were in flight): each becomes an attempt with reason
        ``interrupted`` and stays counted as possibly paid, at what it could have cost. Called
        by the one writer before it sends anything. Returns (how many, their USD)."""
        with self.tx():
            rows = self.db.execute(
                "SELECT id, dataset, prompt_id, sample_idx, turn, backend, started_at, "
                "estimate_usd FROM inflight WHERE state='open'"
            ).fetchall()
            for _, ds, pid, s, t, backend, started, _ in rows:
                self._attempt(
                    Key(ds, pid, s, t), backend, False, INTERRUPTED, None, started, 0.0, None, None
                )
                self.db.execute(
                    f"UPDATE work SET errors=errors+1, last_error=? WHERE {_KEY}",
                    (INTERRUPTED, ds, pid, s, t),
                )
            self.db.execute("UPDATE inflight SET state='interrupted' WHERE state='open'")
        return len(rows), sum(r[7] for r in rows)

    def possibly_paid(self) -> float:
        """USD of the requests in flight at an interrupt: counted against the budget."""
        (usd,) = self.db.execute(
            "SELECT coalesce(sum(estimate_usd), 0) FROM inflight WHERE state='interrupted'"
        ).fetchone()
        return float(usd)
