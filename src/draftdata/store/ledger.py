"""The run ledger: one SQLite file (WAL) per run, and the only code in draftdata that speaks SQL.

It holds the prompts, every attempt with the raw request and raw response stored verbatim the
moment they arrive, one canonical response per (dataset, prompt, sample, turn), the work state,
usage and cost, and the samples made from the responses with their provenance. A response and its
work state are written in one transaction, so a SIGKILL at any moment loses nothing that was
acknowledged and never stores a response twice.

Schema history: 2 kept samples without provenance or mask; 3 keeps both; 4 stores ids as int32
BLOBs and raw bodies compressed, and a response's raw body once (in its attempt). A version-2
ledger is migrated when it is opened for writing: its samples are derived data without
provenance, so they are set aside and made again by the tokens stage (the responses are kept as
they are); a version-3 ledger's columns are converted in place. Opened read-only, an older
ledger is read as it is, through views that give its columns today's names."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..records import Completion, FailedAttempt, Key, Prompt, Sample
from . import codec, schema
from .guard import LedgerError, explain, guarded
from .inflight import INTERRUPTED, InflightMixin
from .reads import ReadsMixin
from .scores import ScoresMixin

__all__ = ["INTERRUPTED", "Ledger", "LedgerError"]

_KEY = "dataset=? AND prompt_id=? AND sample_idx=? AND turn=?"


def _open_read_only(path: Path) -> sqlite3.Connection:
    """``path`` opened read-only. A WAL ledger needs its ``-shm`` file, which SQLite makes
    beside it when missing: on a read-only mount it cannot, so a ledger with no write-ahead
    log to replay is opened ``immutable`` (no one can write to that folder either)."""
    uri = path.resolve().as_uri()
    db = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=30)
    try:
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return db
    except sqlite3.OperationalError:
        db.close()
        if os.access(path.parent, os.W_OK):  # a writer may be at work: never read past it
            raise
        wal = path.with_name(path.name + "-wal")
        if not wal.exists() or not wal.stat().st_size:
            return sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True, timeout=30)
        raise LedgerError(
            f"{path}: its write-ahead log cannot be read in a read-only folder; copy the run "
            "folder to a writable place and read it there"
        ) from None


class Ledger(ReadsMixin, ScoresMixin, InflightMixin):
    """``Ledger(path)`` opens (or creates) a run's ledger for writing; ``Ledger.read(path)``
    opens an existing one read-only, beside a writer."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        self._prompts: dict[str, list[Prompt]] = {}
        if readonly and not path.is_file():
            raise LedgerError(
                f"{path}: no ledger here; pass the run's output folder (the one holding "
                "ledger.sqlite), or run `draftdata run MANIFEST` first"
            )
        if path.is_file() and path.stat().st_size == 0:
            # an empty file is a ledger that was truncated or never written, not a new run:
            # taking it as one would overwrite a good export with an empty one
            raise LedgerError(
                f"{path}: the ledger file is empty (truncated, or a copy that failed); restore "
                f"it from a backup, or move {path.parent} aside to start the run afresh"
            )
        try:
            if readonly:
                self.db = _open_read_only(path)
                version = self._version()
                if version in schema.MIGRATES_FROM:
                    schema.views_of_old_columns(self.db)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                version = self._version()
                if version is not None:
                    bad = self.db.execute("PRAGMA quick_check(1)").fetchone()[0]
                    if bad != "ok":
                        raise sqlite3.DatabaseError(f"damaged: {bad}")
                if version in schema.MIGRATES_FROM:
                    self._migrate(version)
                    version = schema.VERSION
                if version is None or version == schema.VERSION:
                    self.db.executescript(schema.SCHEMA)
        except sqlite3.DatabaseError as e:
            if readonly:
                raise LedgerError(f"{path}: not a readable draftdata ledger ({e})") from e
            raise LedgerError(
                f"{path}: not a usable SQLite ledger ({e}); move it aside to start a fresh run"
            ) from e
        if version is None and not readonly:
            self.set_meta("schema_version", schema.VERSION)
        elif (
            version is not None
            and version != schema.VERSION
            and not (
                readonly
                and version in schema.MIGRATES_FROM  # read as it is; the next writer migrates it
            )
        ):
            raise LedgerError(
                f"{path}: ledger schema {version}, this draftdata reads {schema.VERSION} "
                f"(and migrates {', '.join(map(str, schema.MIGRATES_FROM))}); use the draftdata "
                f"version that made it, or move {path.parent} aside to start the run afresh"
            )

    @classmethod
    def read(cls, path: Path) -> Ledger:
        return cls(path, readonly=True)

    def _version(self) -> int | None:
        has_meta = self.db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        if not has_meta:
            return None
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(json.loads(row[0])) if row else None

    def _migrate(self, version: int) -> None:
        """2 -> 3: samples gain provenance and their mask. The old rows carry neither, so they
        are set aside and the tokens stage makes them again from the stored responses.
        3 -> 4: ids become int32 BLOBs and raw bodies compressed, row by row."""
        with self.tx():
            if version == 2:
                self.db.execute("ALTER TABLE responses ADD COLUMN problem TEXT")
                self.db.execute("DROP TABLE IF EXISTS samples")
                self.db.execute("DELETE FROM drops WHERE stage='tokens'")
            schema.convert_columns(self.db)
            self.set_meta("schema_version", schema.VERSION)
            self.set_meta("migrated_from", version)

    def close(self) -> None:
        self.db.close()

    def tx(self) -> _Tx:
        return _Tx(self.db, self.path)

    # --- meta ----------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # --- prompts and work ----------------------------------------------------------------
    def add_prompts(
        self,
        dataset: str,
        prompts: Iterable[Prompt],
        samples: int,
        turns: Callable[[Prompt], int],
        start: int = 0,
    ) -> int:
        """Prompts (a stream is read one at a time) from position ``start`` on, each with its
        work keys, in one transaction. Returns how many were given."""
        self._prompts.pop(dataset, None)
        with self.tx():
            return self._insert_prompts(dataset, prompts, start, samples, turns)

    def _insert_prompts(
        self,
        dataset: str,
        prompts: Iterable[Prompt],
        start: int,
        samples: int,
        turns: Callable[[Prompt], int],
    ) -> int:
        """Prompts from position ``start`` on, each with its work keys (inside a transaction)."""
        n = 0
        for i, p in enumerate(prompts, start=start):
            n += 1
            self.db.execute(
                "INSERT OR IGNORE INTO prompts VALUES (?,?,?,?,?,?)",
                (dataset, p.id, i, *codec.prompt_row(p)),
            )
            self.db.executemany(
                "INSERT OR IGNORE INTO work (dataset, prompt_id, sample_idx, turn) "
                "VALUES (?,?,?,?)",
                [(dataset, p.id, s, t) for s in range(samples) for t in range(turns(p))],
            )
        return n

    def replace_unanswered(
        self, dataset: str, prompts: list[Prompt], samples: int, turns: Callable[[Prompt], int]
    ) -> tuple[int, int, int]:
        """A dataset read again from a changed source: prompts with an answer stay as they are;
        those without one that the source no longer has are removed with their work; new ones
        are added after the others. Returns (answered kept, removed, added)."""
        answered = {
            r[0]
            for r in self.db.execute(
                "SELECT DISTINCT prompt_id FROM responses WHERE dataset=?", (dataset,)
            )
        }
        existing = {
            r[0]
            for r in self.db.execute("SELECT prompt_id FROM prompts WHERE dataset=?", (dataset,))
        }
        new_ids = {p.id for p in prompts}
        self._prompts.pop(dataset, None)
        gone = sorted(existing - answered - new_ids)
        fresh = [p for p in prompts if p.id not in existing]
        (top,) = self.db.execute(
            "SELECT coalesce(max(idx), -1) FROM prompts WHERE dataset=?", (dataset,)
        ).fetchone()
        with self.tx():
            for pid in gone:
                for table in ("prompts", "work", "drops"):
                    self.db.execute(
                        f"DELETE FROM {table} WHERE dataset=? AND prompt_id=?", (dataset, pid)
                    )
            self._insert_prompts(dataset, fresh, top + 1, samples, turns)
        return len(existing & answered), len(gone), len(fresh)

    def prompts(self, dataset: str) -> list[Prompt]:
        """A dataset's prompts in order. A writer reads them once and keeps them (it holds the
        run's lock: nobody else adds prompts); a reader reads them each time."""
        cached = self._prompts.get(dataset)
        if cached is not None:
            return list(cached)
        rows = self.db.execute(
            "SELECT prompt_id, messages_json, tools_json, metadata_json FROM "
            "prompts WHERE dataset=? ORDER BY idx",
            (dataset,),
        ).fetchall()
        out = [codec.prompt_of(r[0], dataset, r[1], r[2], r[3]) for r in rows]
        if not self.readonly:
            self._prompts[dataset] = out
        return list(out)

    def prompt_ids(self, exclude: str | None = None) -> set[str]:
        rows = self.db.execute(
            "SELECT prompt_id FROM prompts WHERE dataset != ?", (exclude or "",)
        ).fetchall()
        return {r[0] for r in rows}

    # --- the write that matters ------------------------------------------------------------
    def record_failure(self, key: Key, backend: str, f: FailedAttempt) -> None:
        """A failed attempt, verbatim; the key stays pending unless the failure is final."""
        with self.tx():
            self._end(f.intent)
            self._attempt(
                key,
                backend,
                False,
                f.reason,
                f.http_status,
                f.started_at,
                f.latency_s,
                f.request,
                f.response_text,
            )
            self.db.execute(
                f"UPDATE work SET errors=errors+1, last_error=?, state=? WHERE {_KEY}",
                (f.why, "failed" if f.final else "pending", *key.tuple()),
            )

    def record_answer(
        self, key: Key, backend: str, c: Completion, our_prompt_ids: list[int]
    ) -> None:
        """One answer in its own transaction (see ``record_answers``)."""
        self.record_answers([(key, backend, c, our_prompt_ids)])

    def record_answers(self, answers: Sequence[tuple[Key, str, Completion, list[int]]]) -> None:
        """One transaction for a group of answers: for each, the attempt (raw request/response
        verbatim), the canonical response and the work state. Either every answer of the group
        is durable or none is: an answer counts as done only after this returns."""
        notes: dict[str, Counter[str]] = {}
        with self.tx():
            for key, backend, c, our_prompt_ids in answers:
                self._answer(key, backend, c, our_prompt_ids)
                self._end(c.intent)
                if c.usage_note is not None:
                    notes.setdefault(key.dataset, Counter())[c.usage_note.split(":")[0]] += 1
            for dataset, got in notes.items():  # what the server's usage said, if not the truth
                was = Counter(self.get_meta(f"usage_notes:{dataset}", {}))
                self.set_meta(f"usage_notes:{dataset}", dict(was + got))

    def _answer(self, key: Key, backend: str, c: Completion, our_prompt_ids: list[int]) -> None:
        drift = None if c.prompt_ids is None else int(list(c.prompt_ids) != our_prompt_ids)
        attempt = self._attempt(
            key,
            backend,
            True,
            None,
            c.http_status,
            c.started_at,
            c.latency_s,
            c.request,
            c.response_text,
        )
        self.db.execute(
            "INSERT OR IGNORE INTO responses VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
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
                codec.pack_ids(our_prompt_ids),
                c.problem,
            ),
        )
        self.db.execute(f"UPDATE work SET state='done', last_error=NULL WHERE {_KEY}", key.tuple())

    def _attempt(
        self,
        key: Key,
        backend: str,
        ok: bool,
        reason: str | None,
        http_status: int | None,
        started_at: float,
        latency_s: float,
        request: dict[str, Any] | str | None,
        response_text: str | None,
    ) -> int:
        cur = self.db.execute(
            "INSERT INTO attempts (dataset, prompt_id, sample_idx, turn, backend, ok, reason,"
            " http_status, started_at, latency_s, request, response) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                *key.tuple(),
                backend,
                int(ok),
                reason,
                http_status,
                started_at,
                latency_s,
                codec.pack_text(request if isinstance(request, str) else codec.dumps(request))
                if request is not None
                else None,
                codec.pack_text(response_text),
            ),
        )
        return int(cur.lastrowid or 0)

    def quarantine(self, key: Key, reason: str) -> None:
        """A key that cannot be asked (its prompt does not render): kept out of the work with
        its reason, so a rerun does not crash on it again."""
        with self.tx():
            self.db.execute(
                f"UPDATE work SET state='quarantined', last_error=? WHERE {_KEY}",
                (reason, *key.tuple()),
            )
            self.db.execute(
                "INSERT OR REPLACE INTO drops VALUES (?,?,?,?,?,?)",
                (*key.tuple(), "generate", reason),
            )

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

    # --- samples ---------------------------------------------------------------------------
    def put_sample(self, key: Key, sample: Sample) -> None:
        self.put_samples([(key, sample)])

    def put_samples(self, samples: Sequence[tuple[Key, Sample]]) -> None:
        """Samples replacing whatever the tokens stage decided for their keys before."""
        self.put_sample_rows([(k, codec.sample_row(s)) for k, s in samples])

    def put_sample_rows(self, rows: Sequence[tuple[Key, Sequence[Any]]]) -> None:
        """``put_samples`` of samples already packed (``codec.sample_row``, in a worker)."""
        self.db.executemany(
            "INSERT OR REPLACE INTO samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(*k.tuple(), *row) for k, row in rows],
        )
        self.db.executemany(
            f"DELETE FROM drops WHERE {_KEY} AND stage='tokens'", [k.tuple() for k, _ in rows]
        )

    def forget_tokens(self, keys: Sequence[Key]) -> None:
        """What the tokens stage decided for ``keys`` (a sample or a drop), removed."""
        rows = [k.tuple() for k in keys]
        self.db.executemany(f"DELETE FROM samples WHERE {_KEY}", rows)
        self.db.executemany(f"DELETE FROM drops WHERE {_KEY} AND stage='tokens'", rows)

    def put_drop(self, key: Key, stage: str, reason: str) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO drops VALUES (?,?,?,?,?,?)", (*key.tuple(), stage, reason)
        )
        if stage == "tokens":
            self.db.execute(f"DELETE FROM samples WHERE {_KEY}", key.tuple())

    def tokenized(self, dataset: str) -> set[Key]:
        """Keys the tokens stage has decided: a sample or a drop."""
        rows = self.db.execute(
            "SELECT dataset, prompt_id, sample_idx, turn FROM samples WHERE dataset=? UNION "
            "SELECT dataset, prompt_id, sample_idx, turn FROM drops WHERE dataset=? AND "
            "stage='tokens'",
            (dataset, dataset),
        ).fetchall()
        return {Key(*r) for r in rows}

    def untokenized(self, dataset: str) -> int:
        """Stored answers that have neither a sample nor a tokens-stage drop yet."""
        (n,) = self.db.execute(
            "SELECT count(*) FROM responses r WHERE r.dataset=? AND NOT EXISTS (SELECT 1 FROM "
            "samples s WHERE s.dataset=r.dataset AND s.prompt_id=r.prompt_id AND "
            "s.sample_idx=r.sample_idx AND s.turn=r.turn) AND NOT EXISTS (SELECT 1 FROM drops d "
            "WHERE d.dataset=r.dataset AND d.prompt_id=r.prompt_id AND d.sample_idx=r.sample_idx "
            "AND d.turn=r.turn AND d.stage='tokens')",
            (dataset,),
        ).fetchone()
        return int(n)


# every method that touches the file: a full disk or a damaged page is one line that names
# the fix, never a raw sqlite3 traceback
for _name in (
    "set_meta",
    "get_meta",
    "add_prompts",
    "replace_unanswered",
    "prompts",
    "prompt_ids",
    "count_prompts",
    "prompt_ids_of",
    "work_counts",
    "pending_chains",
    "chain_responses",
    "responses",
    "begin",
    "settle_interrupted",
    "possibly_paid",
    "record_failure",
    "record_answer",
    "record_answers",
    "quarantine",
    "failed",
    "put_sample",
    "put_samples",
    "put_sample_rows",
    "put_drop",
    "forget_tokens",
    "tokenized",
    "untokenized",
    "put_score",
    "scored",
    "sample_keys",
):
    setattr(Ledger, _name, guarded(getattr(Ledger, _name)))


class _Tx:
    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self.db = db
        self.db_path = path

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        except sqlite3.Error as e:
            if exc_type is None:  # a COMMIT that failed (a full disk): nothing of it is kept
                raise LedgerError(explain(Path(self.db_path), e)) from e
