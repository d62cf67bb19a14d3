"""``Ledger.answers``: what generation got for each work key. Every attempt with its raw request
and response stored verbatim (``attempts``), one canonical response per key (``responses``),
the key's state in ``work`` (done, failed, quarantined, with a ``generate`` drop), and the
requests in flight (``inflight``).

A response and its work state are written in one transaction, so a SIGKILL at any moment loses
nothing that was acknowledged and never stores a response twice. Requests in flight are written
before they are sent and closed by the transaction that records their outcome, so one left open
by a kill or Ctrl-C is known to the next writer, counted as possibly paid and asked again."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from ..records import AnsweredChain, Completion, FailedAttempt, Key, StoredResponse
from . import codec
from .guard import guarded
from .meta import USAGE_NOTES, Meta
from .part import KEY, Part

#: the reason of an attempt that was in flight when its run was interrupted (possibly paid)
INTERRUPTED = "interrupted"
#: the ``inflight`` states of requests that may have been paid and gave no answer: in flight at
#: an interrupt, or sent and never answered (a timeout, a cut connection)
POSSIBLY_PAID = ("interrupted", "unanswered")

#: a stored answer's columns (``_stored`` reads them in this order) and where they come from.
#: A first turn's ``our_prompt_ids`` equal to the ids stored with its prompt are not stored
#: again (NULL): they are read from the prompt (a ledger whose prompts have no ``first_ids``
#: column, schema 4 and older read in place, has every answer's own)
_COLUMNS = (
    "r.dataset, r.prompt_id, r.sample_idx, r.turn, r.backend, r.response_json, a.response, "
    "r.output_ids, r.prompt_ids, r.finish_reason, r.cost_usd, {ours}, r.problem"
)
_FROM = "FROM responses r LEFT JOIN attempts a ON a.id = r.attempt_id"
_FIRST = (
    " LEFT JOIN prompts fp ON r.turn = 0 AND fp.dataset = r.dataset AND fp.prompt_id = r.prompt_id"
)
#: our prompt ids, or NULL where they are the prompt's stored first turn (compared as packed:
#: the same ids pack to the same bytes in one process; where they do not, they are stored)
#: an attempt's columns after its id, and their placeholders
_ATTEMPT = (
    "dataset, prompt_id, sample_idx, turn, backend, ok, reason, http_status, started_at, "
    "latency_s, request, response"
)
_A = ",".join("?" * 12)
_OURS = (
    "CASE WHEN ? = 0 AND ? = (SELECT first_ids FROM prompts WHERE dataset=? AND prompt_id=?) "
    "THEN NULL ELSE ? END"
)


class Answers(Part):
    def __init__(self, db: sqlite3.Connection, path: Path, readonly: bool, meta: Meta) -> None:
        super().__init__(db, path, readonly)
        self.meta = meta
        self._select: tuple[str, str] | None = None

    def _columns_from(self) -> tuple[str, str]:
        """The answer columns and the tables they come from, for this ledger's schema (asked
        once, at the first read: a new ledger's tables are made after this part)."""
        if self._select is None:
            has = any(r[1] == "first_ids" for r in self.db.execute("PRAGMA table_info(prompts)"))
            ours = "coalesce(r.our_prompt_ids, fp.first_ids)" if has else "r.our_prompt_ids"
            self._select = (_COLUMNS.format(ours=ours), _FROM + (_FIRST if has else ""))
        return self._select

    def _response(self) -> str:
        cols, src = self._columns_from()
        return f"SELECT {cols} {src} WHERE r.dataset=?"

    # --- requests in flight --------------------------------------------------------------------
    @guarded
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

    @guarded
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
                k = Key(ds, pid, s, t)
                self._attempt(
                    self._attempt_row(k, backend, False, INTERRUPTED, None, None, None, started)
                )
                self.db.execute(
                    f"UPDATE work SET errors=errors+1, last_error=? WHERE {KEY}",
                    (INTERRUPTED, ds, pid, s, t),
                )
            self.db.execute("UPDATE inflight SET state='interrupted' WHERE state='open'")
        return len(rows), sum(r[7] for r in rows)

    @guarded
    def possibly_paid(self) -> float:
        """USD of the requests that may have been paid and gave no answer (in flight at an
        interrupt, or sent and never answered): counted against the budget."""
        (usd,) = self.db.execute(
            "SELECT coalesce(sum(estimate_usd), 0) FROM inflight WHERE state IN (?, ?)",
            POSSIBLY_PAID,
        ).fetchone()
        return float(usd)

    # --- the write that matters ----------------------------------------------------------------
    @guarded
    def record_failure(
        self, key: Key, backend: str, f: FailedAttempt, charged: float | None = None
    ) -> None:
        """A failed attempt, verbatim; the key stays pending unless the failure is final.
        ``charged``: what it was charged as possibly paid (a timeout, a cut connection): its
        request stays in ``inflight`` as ``unanswered`` at that figure, counted against the
        budget of every later run."""
        with self.tx():
            if charged is None:
                self._end(f.intent)
            elif f.intent is not None:
                self.db.execute(
                    "UPDATE inflight SET state='unanswered', estimate_usd=? WHERE id=?",
                    (charged, f.intent),
                )
            else:
                self.db.execute(
                    "INSERT INTO inflight (dataset, prompt_id, sample_idx, turn, backend, "
                    "started_at, estimate_usd, state) VALUES (?,?,?,?,?,?,?,'unanswered')",
                    (*key.tuple(), backend, f.started_at, charged),
                )
            self._attempt(
                self._attempt_row(key, backend, False, f.reason, f, f.request, f.response_text)
            )
            self.db.execute(
                f"UPDATE work SET errors=errors+1, last_error=?, state=? WHERE {KEY}",
                (f.why, "failed" if f.final else "pending", *key.tuple()),
            )

    @guarded
    def record_one(self, key: Key, backend: str, c: Completion, our_prompt_ids: list[int]) -> None:
        """One answer in its own transaction (see ``record``)."""
        self.record([(key, backend, c, our_prompt_ids)])

    @guarded
    def record(self, answers: Sequence[tuple[Key, str, Completion, list[int]]]) -> None:
        """One transaction for a group of answers: for each, the attempt (raw request/response
        verbatim), the canonical response and the work state. Either every answer of the group
        is durable or none is: an answer counts as done only after this returns. Written a
        statement per table for the group (the attempts' ids given here, after the highest
        ever used: the run's one writer holds the ledger)."""
        notes: dict[str, Counter[str]] = {}
        with self.tx():
            (top,) = self.db.execute(
                "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name='attempts'), 0),"
                " coalesce((SELECT max(id) FROM attempts), 0))"
            ).fetchone()
            attempts, responses = [], []
            for i, (key, backend, c, our_prompt_ids) in enumerate(answers, start=top + 1):
                attempts.append(
                    (i, *self._attempt_row(key, backend, True, None, c, c.request, c.response_text))
                )
                responses.append(self._response_row(key, i, backend, c, our_prompt_ids))
                if c.usage_note is not None:
                    notes.setdefault(key.dataset, Counter())[c.usage_note.split(":")[0]] += 1
            self.db.executemany(f"INSERT INTO attempts (id, {_ATTEMPT}) VALUES (?,{_A})", attempts)
            self.db.executemany(
                f"INSERT OR IGNORE INTO responses VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,{_OURS},?)",
                responses,
            )
            self.db.executemany(
                f"UPDATE work SET state='done', last_error=NULL WHERE {KEY}",
                [key.tuple() for key, *_ in answers],
            )
            self.db.executemany(
                "DELETE FROM inflight WHERE id=? AND state='open'",
                [(c.intent,) for _, _, c, _ in answers if c.intent is not None],
            )
            for dataset, got in notes.items():  # what the server's usage said, if not the truth
                was: dict[str, int] = self.meta.get(USAGE_NOTES.of(dataset), {})
                self.meta.put(USAGE_NOTES.of(dataset), dict(Counter(was) + got))

    @staticmethod
    def _response_row(
        key: Key, attempt: int, backend: str, c: Completion, our_prompt_ids: list[int]
    ) -> tuple[Any, ...]:
        drift = None if c.prompt_ids is None else int(list(c.prompt_ids) != our_prompt_ids)
        ours = codec.pack_ids(our_prompt_ids)
        return (
            *key.tuple(),
            attempt,
            backend,
            None if c.response_is_body else codec.dumps(c.response),
            codec.pack_ids(c.output_ids),
            codec.pack_ids(c.prompt_ids),
            c.finish_reason,
            c.prompt_tokens,
            c.completion_tokens,
            c.cost_usd,
            drift,
            time.time(),
            key.turn,
            ours,
            key.dataset,
            key.prompt_id,
            ours,
            c.problem,
        )

    @staticmethod
    def _attempt_row(
        key: Key,
        backend: str,
        ok: bool,
        reason: str | None,
        c: Completion | FailedAttempt | None,
        request: dict[str, Any] | str | None,
        response_text: str | None,
        started_at: float = 0.0,
    ) -> tuple[Any, ...]:
        """An attempt's columns after its id (``_ATTEMPT``); its status and times from ``c``
        (None: an attempt interrupted before either, started at ``started_at``)."""
        return (
            *key.tuple(),
            backend,
            int(ok),
            reason,
            c.http_status if c is not None else None,
            c.started_at if c is not None else started_at,
            c.latency_s if c is not None else 0.0,
            codec.pack_text(request if isinstance(request, str) else codec.dumps(request))
            if request is not None
            else None,
            codec.pack_text(response_text),
        )

    def _attempt(self, row: tuple[Any, ...]) -> int:
        """One attempt (``_attempt_row``'s columns) in its own statement; its id."""
        cur = self.db.execute(f"INSERT INTO attempts ({_ATTEMPT}) VALUES ({_A})", row)
        return int(cur.lastrowid or 0)

    @guarded
    def quarantine(self, key: Key, reason: str) -> None:
        """A key that cannot be asked (its prompt does not render): kept out of the work with
        its reason, so a rerun does not crash on it again."""
        with self.tx():
            self.db.execute(
                f"UPDATE work SET state='quarantined', last_error=? WHERE {KEY}",
                (reason, *key.tuple()),
            )
            self.db.execute(
                "INSERT OR REPLACE INTO drops VALUES (?,?,?,?,?,?)",
                (*key.tuple(), "generate", reason),
            )

    @guarded
    def failed(self, dataset: str | None = None) -> list[tuple[Key, str, str]]:
        """(key, state, reason) of every key that failed, was quarantined, or whose answer the
        tokens stage dropped: what `draftdata status --failed` lists."""
        where, args = ("WHERE w.dataset=?", (dataset,)) if dataset else ("", ())
        rows = self.db.execute(
            "SELECT w.dataset, w.prompt_id, w.sample_idx, w.turn, w.state, "
            "coalesce(d.reason, w.last_error, '') FROM work w LEFT JOIN drops d ON "
            "d.dataset=w.dataset AND d.prompt_id=w.prompt_id AND d.sample_idx=w.sample_idx AND "
            f"d.turn=w.turn {where} ORDER BY 1, 2, 3, 4",
            args,
        ).fetchall()
        return [
            (Key(*r[:4]), "dropped" if r[4] == "done" else r[4], r[5])
            for r in rows
            if r[4] in ("failed", "quarantined") or (r[4] == "done" and r[5])
        ]

    # --- reading them back ---------------------------------------------------------------------
    def count(self, dataset: str) -> int:
        (n,) = self.db.execute(
            "SELECT count(*) FROM responses WHERE dataset=?", (dataset,)
        ).fetchone()
        return int(n)

    @guarded
    def of(self, dataset: str) -> dict[Key, StoredResponse]:
        """Every stored answer of a dataset. A response body is kept once, in its attempt;
        ``response_json`` holds only what was not a body (an engine's own record)."""
        rows = self.db.execute(self._response(), (dataset,)).fetchall()
        return {s.key: s for s in map(_stored, rows)}

    @guarded
    def of_chain(self, dataset: str, prompt_id: str, sample: int) -> dict[int, StoredResponse]:
        """The stored answers of one conversation, by turn."""
        rows = self.db.execute(
            self._response() + " AND r.prompt_id=? AND r.sample_idx=?", (dataset, prompt_id, sample)
        ).fetchall()
        return {s.key.turn: s for s in map(_stored, rows)}

    def chains(self, dataset: str) -> Iterator[AnsweredChain]:
        """Every answered conversation of a dataset with its prompt and stored answers (turn
        order), one at a time (a cursor in the responses' key order: memory holds one
        conversation)."""
        cols, src = self._columns_from()
        cur = self.db.execute(
            f"SELECT {cols}, p.messages_json, p.tools_json, p.metadata_json {src} "
            "JOIN prompts p ON p.dataset = r.dataset AND p.prompt_id = r.prompt_id "
            "WHERE r.dataset=? ORDER BY r.prompt_id, r.sample_idx, r.turn",
            (dataset,),
        )
        rows = (r for batch in iter(lambda: cur.fetchmany(256), []) for r in batch)
        for (pid, s), group in groupby(rows, key=lambda r: (r[1], r[2])):
            chain = list(group)
            head = chain[0]
            yield AnsweredChain(
                codec.prompt_of(pid, dataset, head[13], head[14], head[15]),
                s,
                tuple(_stored(r) for r in chain),
            )


def _stored(r: Sequence[Any]) -> StoredResponse:
    problem = r[12]
    response: dict[str, Any] = {}
    if problem is None:  # a quarantined answer's body is kept, never parsed again
        body = r[5] if r[5] is not None else codec.unpack_text(r[6])
        try:
            got = json.loads(body) if body else {}
        except (ValueError, RecursionError) as e:  # stored by a draftdata that read it less
            got, problem = {}, f"unusable_message: the stored body does not parse ({e})"[:200]
        if isinstance(got, dict):
            response = got
    return StoredResponse(
        Key(*r[:4]),
        r[4],
        response,
        codec.unpack_ids(r[7]),
        codec.unpack_ids(r[8]),
        r[9],
        r[10],
        codec.unpack_ids(r[11]),
        problem,
    )
