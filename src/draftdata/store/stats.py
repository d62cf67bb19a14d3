"""What the ledger says about a run, as typed figures: work state, attempts, errors, cost, drops
and warnings per dataset (``status``), and request throughput (``throughput``). Read-only
queries; `draftdata status`, the export manifest and the report read through these."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .ledger import Ledger


@dataclass(frozen=True)
class DatasetStatus:
    total: int = 0
    done: int = 0
    failed: int = 0
    pending: int = 0
    #: keys answered more than once (must stay 0: nothing is paid twice)
    duplicates: int = 0
    attempts: int = 0
    samples: int = 0
    cost_usd: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    #: (answers whose server reported its prompt ids, of those how many differ from ours)
    template_drift: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "pending": self.pending,
            "duplicates": self.duplicates,
            "errors": dict(self.errors),
            "cost_usd": self.cost_usd,
            "attempts": self.attempts,
            "samples": self.samples,
            "drops": dict(self.drops),
            "warnings": dict(self.warnings),
        }
        if self.template_drift is not None:
            doc["template_drift"] = {
                "checked": self.template_drift[0],
                "differs": self.template_drift[1],
            }
        return doc


@dataclass(frozen=True)
class RunStatus:
    datasets: dict[str, DatasetStatus]

    @property
    def cost_usd(self) -> float:
        return round(sum(d.cost_usd for d in self.datasets.values()), 6)

    def dataset(self, name: str) -> DatasetStatus:
        return self.datasets.get(name) or DatasetStatus()

    def to_json(self) -> dict[str, Any]:
        return {
            "datasets": {k: v.to_json() for k, v in self.datasets.items()},
            "cost_usd": self.cost_usd,
        }


def status(led: Ledger) -> RunStatus:
    db = led.db
    ds: dict[str, dict[str, Any]] = {}

    def d(name: str) -> dict[str, Any]:
        return ds.setdefault(
            name,
            {
                "errors": {},
                "drops": {},
                "warnings": {},
                "total": 0,
                "done": 0,
                "failed": 0,
                "pending": 0,
            },
        )

    for dataset, state, n in db.execute(
        "SELECT dataset, state, count(*) FROM work GROUP BY dataset, state"
    ):
        x = d(dataset)
        x["total"] += n
        x[state if state in ("done", "failed") else "pending"] += n
    for dataset, n in db.execute(
        "SELECT dataset, count(*) FROM (SELECT dataset FROM attempts WHERE ok=1 GROUP BY "
        "dataset, prompt_id, sample_idx, turn HAVING count(*) > 1) GROUP BY dataset"
    ):
        d(dataset)["duplicates"] = n
    for dataset, reason, n in db.execute(
        "SELECT dataset, reason, count(*) FROM attempts WHERE ok=0 GROUP BY dataset, reason"
    ):
        d(dataset)["errors"][reason] = n
    for dataset, n in db.execute("SELECT dataset, count(*) FROM attempts GROUP BY dataset"):
        d(dataset)["attempts"] = n
    for dataset, cost in db.execute(
        "SELECT dataset, sum(cost_usd) FROM responses GROUP BY dataset"
    ):
        d(dataset)["cost_usd"] = round(cost or 0.0, 6)
    for dataset, n in db.execute("SELECT dataset, count(*) FROM samples GROUP BY dataset"):
        d(dataset)["samples"] = n
    for dataset, w, n in db.execute(
        "SELECT dataset, w.value, count(*) FROM samples, json_each(samples.warnings_json) AS w "
        "GROUP BY dataset, w.value"
    ):
        d(dataset)["warnings"][w] = n
    for dataset, reason, n in db.execute(
        "SELECT dataset, reason, count(*) FROM drops GROUP BY dataset, reason"
    ):
        d(dataset)["drops"][reason] = n
    for dataset, bad, checked in db.execute(
        "SELECT dataset, sum(prompt_drift), count(prompt_drift) FROM responses GROUP BY dataset"
    ):
        if checked:
            d(dataset)["template_drift"] = (checked, bad)
    return RunStatus({name: DatasetStatus(**x) for name, x in ds.items()})


# --- throughput ---------------------------------------------------------------------------------
@dataclass
class Throughput:
    """What the ledger says about one dataset's requests."""

    work: Counter[str] = field(default_factory=Counter)  # state -> keys
    attempts: int = 0
    ok: int = 0
    active_s: float = 0.0  # union of the attempts' [start, start + latency] intervals
    responses: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_p50: float | None = None
    latency_p95: float | None = None
    errors: Counter[tuple[str, int | None]] = field(default_factory=Counter)

    @property
    def failed_attempts(self) -> int:
        return self.attempts - self.ok

    @property
    def requests_per_s(self) -> float | None:
        return self.attempts / self.active_s if self.active_s > 0 else None

    @property
    def completion_tokens_per_s(self) -> float | None:
        return self.completion_tokens / self.active_s if self.active_s > 0 else None


def active_seconds(intervals: Iterator[tuple[float, float]]) -> float:
    """Length of the union of [start, start + duration] intervals sorted by start: time spent
    with at least one request in flight (a resumed run's pauses are not counted)."""
    total = 0.0
    cur_start: float | None = None
    cur_end = 0.0
    for start, dur in intervals:
        end = start + max(dur, 0.0)
        if cur_start is None or start > cur_end:
            if cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_start is not None:
        total += cur_end - cur_start
    return total


def _latency(db: sqlite3.Connection, where: str, args: tuple[Any, ...], n: int, q: float) -> float:
    row = db.execute(
        f"SELECT latency_s FROM attempts WHERE ok=1 {where} ORDER BY latency_s LIMIT 1 OFFSET ?",
        (*args, min(n - 1, int(q * n))),
    ).fetchone()
    return float(row[0])


def throughput(led: Ledger, dataset: str | None) -> Throughput:
    """One dataset's figures, or the whole run's with ``dataset=None``."""
    db = led.db
    where, args = ("AND dataset=?", (dataset,)) if dataset is not None else ("", ())
    t = Throughput()
    for state, n in db.execute(
        f"SELECT state, count(*) FROM work WHERE 1=1 {where} GROUP BY state", args
    ):
        t.work[state] += n
    t.attempts, t.ok = db.execute(
        f"SELECT count(*), coalesce(sum(ok), 0) FROM attempts WHERE 1=1 {where}", args
    ).fetchone()
    t.active_s = active_seconds(
        db.execute(
            f"SELECT started_at, latency_s FROM attempts WHERE 1=1 {where} ORDER BY started_at",
            args,
        )
    )
    if t.ok:
        t.latency_p50 = _latency(db, where, args, t.ok, 0.5)
        t.latency_p95 = _latency(db, where, args, t.ok, 0.95)
    t.responses, t.prompt_tokens, t.completion_tokens, t.cost_usd = db.execute(
        "SELECT count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0),"
        f" coalesce(sum(cost_usd), 0) FROM responses WHERE 1=1 {where}",
        args,
    ).fetchone()
    for reason, status_, n in db.execute(
        f"SELECT coalesce(reason, 'unknown'), http_status, count(*) FROM attempts WHERE ok=0 "
        f"{where} GROUP BY 1, 2",
        args,
    ):
        t.errors[(reason, status_)] += n
    return t


def work_datasets(led: Ledger) -> list[str]:
    return [r[0] for r in led.db.execute("SELECT DISTINCT dataset FROM work ORDER BY 1")]
