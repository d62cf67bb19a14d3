"""What the ledger says about a run, as typed figures: work state, attempts, errors, cost, drops
and warnings per dataset (``status``), and request throughput (``throughput``). Read-only
queries; `draftdata status`, the export manifest and the report read through these."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..records.counting import warning_kind
from .ledger import Ledger
from .meta import USAGE_NOTES
from .part import has_table


@dataclass(frozen=True)
class DatasetStatus:
    total: int = 0
    done: int = 0
    failed: int = 0
    pending: int = 0
    #: keys that cannot be asked (a prompt that does not render), kept out with their reason
    quarantined: int = 0
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
    #: the lossless request fields generation asked for, and what the server did with them
    server_options: ServerOptions | None = None
    #: answers whose server ``usage`` was not taken as it is: ``invalid`` (not finite,
    #: negative, out of range), ``under`` (fewer tokens than draftdata's own count)
    usage_notes: dict[str, int] = field(default_factory=dict)
    #: requests in flight when a run was interrupted (asked again), requests sent and never
    #: answered (timed out, cut), and what both may have cost (charged against the budget)
    interrupted: int = 0
    unanswered: int = 0
    possibly_paid_usd: float = 0.0
    #: requests written as in flight now (by a writer that is running, or one killed since)
    in_flight: int = 0

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "pending": self.pending,
            "quarantined": self.quarantined,
            "duplicates": self.duplicates,
            "errors": dict(self.errors),
            "cost_usd": self.cost_usd,
            "attempts": self.attempts,
            "samples": self.samples,
            "drops": dict(self.drops),
            "warnings": dict(self.warnings),
            "usage_notes": dict(self.usage_notes),
            "interrupted": self.interrupted,
            "unanswered": self.unanswered,
            "possibly_paid_usd": self.possibly_paid_usd,
            "in_flight": self.in_flight,
        }
        if self.template_drift is not None:
            doc["template_drift"] = {
                "checked": self.template_drift[0],
                "differs": self.template_drift[1],
            }
        if self.server_options is not None:
            doc["server_options"] = self.server_options.to_json()
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
                "quarantined": 0,
            },
        )

    for dataset, state, n in db.execute(
        "SELECT dataset, state, count(*) FROM work GROUP BY dataset, state"
    ):
        x = d(dataset)
        x["total"] += n
        x[state if state in ("done", "failed", "quarantined") else "pending"] += n
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
        ws, kind = d(dataset)["warnings"], warning_kind(w)  # not one sample's own figures
        ws[kind] = ws.get(kind, 0) + n
    for dataset, reason, n in db.execute(
        "SELECT dataset, reason, count(*) FROM drops GROUP BY dataset, reason"
    ):
        d(dataset)["drops"][reason] = n
    for dataset, bad, checked in db.execute(
        "SELECT dataset, sum(prompt_drift), count(prompt_drift) FROM responses GROUP BY dataset"
    ):
        if checked:
            d(dataset)["template_drift"] = (checked, bad)
    if has_table(db, "inflight"):  # a ledger of an older draftdata, read-only, has none
        for dataset, state, n, usd in db.execute(
            "SELECT dataset, state, count(*), sum(estimate_usd) FROM inflight "
            "GROUP BY dataset, state"
        ):
            if state == "open":
                d(dataset)["in_flight"] = n
                continue
            d(dataset)["unanswered" if state == "unanswered" else "interrupted"] = n
            paid = d(dataset).get("possibly_paid_usd", 0.0) + (usd or 0.0)
            d(dataset)["possibly_paid_usd"] = round(paid, 6)
    for dataset in ds:
        notes = led.meta.get(USAGE_NOTES.of(dataset))
        if notes:
            d(dataset)["usage_notes"] = notes
    for dataset in ds:
        opts = server_options(db, dataset)
        if opts.asked or opts.refused:
            d(dataset)["server_options"] = opts
    return RunStatus({name: DatasetStatus(**x) for name, x in ds.items()})


# --- server options -----------------------------------------------------------------------------


def _lossless_fields() -> dict[str, tuple[Any, tuple[str, ...]]]:
    """Request fields that keep a server's view lossless, the value that asks for each, and the
    servers that implement it: the server profiles' own ``lossless_request``, plus vLLM's
    ``return_token_ids`` (granted only where the ids came back)."""
    from ..records.servers import PROFILES

    fields: dict[str, tuple[Any, tuple[str, ...]]] = {
        "return_token_ids": (True, ("vllm", "sglang"))
    }
    for p in PROFILES.values():
        for name, value in p.lossless_request.items():
            fields[name] = (value, (*fields.get(name, (value, ()))[1], p.name))
    return fields


LOSSLESS_FIELDS = _lossless_fields()
#: the latest answers per dataset whose stored request and response are read for it
OPTIONS_CHECKED = 256


@dataclass(frozen=True)
class ServerOptions:
    """What generation asked a server for to keep its view lossless, and what it got, read from
    the stored bodies of a dataset's latest ``checked`` answers: a field is ``granted`` where the
    answer came from a server that implements it (told from the response's own fields, as
    ``reconstruct`` tells it), or, for ``return_token_ids``, where the ids came back; asked and
    not granted means not shown to be applied. ``refused`` counts failed attempts whose 4xx body
    names the field (the capability probe's refusal of ``return_token_ids`` names it too)."""

    checked: int
    answered_by: dict[str, int]
    asked: dict[str, int]
    granted: dict[str, int]
    refused: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "answered_by": dict(self.answered_by),
            "asked": dict(self.asked),
            "granted": dict(self.granted),
            "refused": dict(self.refused),
        }

    def lines(self) -> list[str]:
        """One line per field asked or refused, for `draftdata status`."""
        by = ", ".join(f"{k} {v}" for k, v in sorted(self.answered_by.items()))
        out = []
        for name, (value, _) in LOSSLESS_FIELDS.items():
            asked, got = self.asked.get(name, 0), self.granted.get(name, 0)
            refused = self.refused.get(name, 0)
            if not asked and not refused:
                continue
            what = f"{name}={json.dumps(value)}"
            if asked and got == asked:
                verdict = f"granted on {got}/{asked} answers"
            elif asked:
                verdict = (
                    f"granted on {got}/{asked} answers; the rest came from a server that does not "
                    "show it applies it (name the server, or ask for token ids)"
                )
            else:
                verdict = "not asked in the answers read"
            if refused:
                verdict += f"; refused by {refused} attempts"
            out.append(f"{what}: {verdict} (latest {self.checked} answers; answered by {by})")
        return out


def _body(blob: bytes | str | None) -> Any:
    """A stored body parsed, or None where it is damaged or not JSON (status must not fail on
    one bad row: export reads it too)."""
    from .codec import BlobError, unpack_text

    try:
        return json.loads(unpack_text(blob) or "null")
    except (ValueError, RecursionError, *BlobError):
        return None


def server_options(db: sqlite3.Connection, dataset: str) -> ServerOptions:
    """The lossless request fields of ``dataset``'s latest answers and what came of them."""
    from ..records.wire import detect_server, ids_returned
    from .codec import BlobError, unpack_text

    asked: Counter[str] = Counter()
    granted: Counter[str] = Counter()
    by: Counter[str] = Counter()
    n = 0
    rows = db.execute(
        "SELECT request, response FROM attempts WHERE dataset = ? AND ok = 1 "
        "ORDER BY id DESC LIMIT ?",
        (dataset, OPTIONS_CHECKED),
    )
    for req_blob, resp_blob in rows:
        req, resp = _body(req_blob), _body(resp_blob)
        if not isinstance(req, dict) or not isinstance(resp, dict):
            continue  # an engine's own record, a body that is not an object, a damaged blob
        n += 1
        server = detect_server(resp) or "unknown"
        by[server] += 1
        for name, (value, servers) in LOSSLESS_FIELDS.items():
            if name not in req or req[name] != value:
                continue
            asked[name] += 1
            if name == "return_token_ids":  # where the wire parser reads them: vLLM's or SGLang's
                granted[name] += int(ids_returned(resp))
            elif server in servers:
                granted[name] += 1
    refused: Counter[str] = Counter()
    for (body,) in db.execute(
        "SELECT response FROM attempts WHERE dataset = ? AND ok = 0 AND http_status IN (400, 422)",
        (dataset,),
    ):
        try:
            text = unpack_text(body) or ""
        except BlobError:
            continue
        refused.update(name for name in LOSSLESS_FIELDS if name in text)
    return ServerOptions(n, dict(by), dict(asked), dict(granted), dict(refused))


# --- throughput ---------------------------------------------------------------------------------
#: the capability probe's expected refusal of vLLM's ``return_token_ids`` (the value of
#: ``generate.backends.retry.PROBE_REFUSED``; a test keeps the two equal): not a failure
PROBE_REFUSED = "capability_probe_refused"
#: below this many attempts or this much wall time a rate is noise, and is not given
MIN_RATE_ATTEMPTS = 10
MIN_RATE_WALL_S = 5.0


@dataclass
class Throughput:
    """What the ledger says about one dataset's requests. ``attempts``, ``ok`` and ``errors``
    leave out the capability probe's expected refusals, counted in ``probe_refused``."""

    work: Counter[str] = field(default_factory=Counter)  # state -> keys
    attempts: int = 0
    ok: int = 0
    probe_refused: int = 0
    first_start: float | None = None  # earliest attempt start (epoch seconds)
    last_end: float | None = None  # latest attempt end: start + latency
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
    def wall_s(self) -> float | None:
        """From the first attempt's start to the last attempt's end (pauses included)."""
        if self.first_start is None or self.last_end is None:
            return None
        return max(self.last_end - self.first_start, 0.0)

    @property
    def rate_note(self) -> str | None:
        """Why no rate is given (too few attempts, too short), or None where rates are given."""
        wall = self.wall_s
        if not self.attempts or wall is None:
            return "no attempts"
        if self.attempts < MIN_RATE_ATTEMPTS:
            return f"only {self.attempts} attempts"
        if wall < MIN_RATE_WALL_S:
            return f"only {wall:.1f} s of wall time"
        return None

    @property
    def requests_per_s(self) -> float | None:
        """Attempts per second of wall time; None where too few or too short to say."""
        wall = self.wall_s
        return None if self.rate_note or not wall else self.attempts / wall

    @property
    def completion_tokens_per_s(self) -> float | None:
        """Completion tokens per second of wall time; None as for ``requests_per_s``, and where
        the server reported no token counts."""
        wall = self.wall_s
        if self.rate_note or not wall or not self.completion_tokens:
            return None
        return self.completion_tokens / wall


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
    probe = f"AND NOT (ok=0 AND coalesce(reason, '') = '{PROBE_REFUSED}')"
    t.attempts, t.ok = db.execute(
        f"SELECT count(*), coalesce(sum(ok), 0) FROM attempts WHERE 1=1 {probe} {where}", args
    ).fetchone()
    t.probe_refused, t.first_start, t.last_end = db.execute(
        f"SELECT coalesce(sum(ok=0 AND reason='{PROBE_REFUSED}'), 0), min(started_at), "
        f"max(started_at + max(latency_s, 0)) FROM attempts WHERE 1=1 {where}",
        args,
    ).fetchone()
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
        f"{probe} {where} GROUP BY 1, 2",
        args,
    ):
        t.errors[(reason, status_)] += n
    return t


def work_datasets(led: Ledger) -> list[str]:
    return [r[0] for r in led.db.execute("SELECT DISTINCT dataset FROM work ORDER BY 1")]


# --- what a forecast stands on ----------------------------------------------------------------
def answer_sums(led: Ledger) -> dict[str, tuple[int, int, int, float, float]]:
    """Per dataset: its stored answers, and their prompt tokens (the server's count), completion
    tokens, cost and the latency of the attempts that gave them, summed."""
    rows = led.db.execute(
        "SELECT r.dataset, count(*), coalesce(sum(r.prompt_tokens), 0), "
        "coalesce(sum(r.completion_tokens), 0), coalesce(sum(r.cost_usd), 0), "
        "coalesce(sum(a.latency_s), 0) FROM responses r "
        "LEFT JOIN attempts a ON a.id = r.attempt_id GROUP BY r.dataset"
    ).fetchall()
    return {r[0]: (int(r[1]), int(r[2]), int(r[3]), float(r[4]), float(r[5])) for r in rows}


def pages_bytes(led: Ledger, names: tuple[str, ...]) -> int:
    """The bytes of the pages these tables and indexes hold (SQLite's ``dbstat``; 0 where it is
    not built in)."""
    marks = ",".join("?" * len(names))
    try:
        (got,) = led.db.execute(
            f"SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN ({marks})", names
        ).fetchone()
    except sqlite3.Error:
        return 0
    return int(got)


def prompt_total(led: Ledger) -> int:
    (n,) = led.db.execute("SELECT count(*) FROM prompts").fetchone()
    return int(n)
