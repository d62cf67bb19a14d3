"""The run ledger: one SQLite file (WAL) per run.

It holds the prompts, every attempt with the raw request and raw response stored verbatim the
moment they arrive, one canonical response per (dataset, prompt, sample, turn), the work state,
usage and cost. A response and its work state are written in one transaction, so a SIGKILL at
any moment loses nothing that was acknowledged and never stores a response twice."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DraftdataError
from ..records import Message, Prompt, ToolCall

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS prompts (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, idx INTEGER NOT NULL,
  messages_json TEXT NOT NULL, tools_json TEXT NOT NULL, metadata_json TEXT NOT NULL,
  PRIMARY KEY (dataset, prompt_id));
CREATE TABLE IF NOT EXISTS work (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'pending',
  errors INTEGER NOT NULL DEFAULT 0, last_error TEXT,
  PRIMARY KEY (dataset, prompt_id, sample_idx, turn));
CREATE TABLE IF NOT EXISTS attempts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, backend TEXT NOT NULL, ok INTEGER NOT NULL, reason TEXT,
  http_status INTEGER, started_at REAL NOT NULL, latency_s REAL NOT NULL,
  request_json TEXT, response_text TEXT);
CREATE INDEX IF NOT EXISTS attempts_key ON attempts (dataset, prompt_id, sample_idx, turn);
CREATE TABLE IF NOT EXISTS responses (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, attempt_id INTEGER NOT NULL, backend TEXT NOT NULL,
  response_json TEXT NOT NULL, output_ids_json TEXT, prompt_ids_json TEXT,
  finish_reason TEXT NOT NULL, prompt_tokens INTEGER, completion_tokens INTEGER,
  cost_usd REAL NOT NULL DEFAULT 0, prompt_drift INTEGER, created_at REAL NOT NULL,
  our_prompt_ids_json TEXT,
  PRIMARY KEY (dataset, prompt_id, sample_idx, turn));
CREATE TABLE IF NOT EXISTS samples (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, token_source TEXT NOT NULL, finish_reason TEXT NOT NULL,
  input_ids_json TEXT NOT NULL, prompt_len INTEGER NOT NULL, warnings_json TEXT NOT NULL,
  PRIMARY KEY (dataset, prompt_id, sample_idx, turn));
CREATE TABLE IF NOT EXISTS drops (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, stage TEXT NOT NULL, reason TEXT NOT NULL,
  PRIMARY KEY (dataset, prompt_id, sample_idx, turn, stage));
"""


class LedgerError(DraftdataError):
    """The ledger file is unusable."""


@dataclass(frozen=True)
class Key:
    dataset: str
    prompt_id: str
    sample_idx: int
    turn: int

    def tuple(self) -> tuple[str, str, int, int]:
        return (self.dataset, self.prompt_id, self.sample_idx, self.turn)


@dataclass(frozen=True)
class StoredResponse:
    key: Key
    backend: str
    response: dict[str, Any]
    output_ids: list[int] | None
    prompt_ids: list[int] | None
    finish_reason: str
    cost_usd: float
    #: our rendering of the prompt when it was asked (saves rendering it again for the sample)
    our_prompt_ids: list[int] | None = None


def messages_to_json(msgs: Iterable[Message]) -> str:
    return json.dumps(
        [
            {
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "tool_calls": [
                    {"id": c.id, "type": c.type, "name": c.name, "arguments": c.arguments}
                    for c in m.tool_calls
                ],
                "tool_call_id": m.tool_call_id,
                "name": m.name,
            }
            for m in msgs
        ],
        ensure_ascii=False,
    )


def messages_from_json(text: str) -> tuple[Message, ...]:
    return tuple(
        Message(
            d["role"],
            d["content"],
            d.get("reasoning"),
            tuple(
                ToolCall(c["name"], c["arguments"], c.get("id"), c.get("type", "function"))
                for c in d["tool_calls"]
            ),
            d.get("tool_call_id"),
            d.get("name"),
        )
        for d in json.loads(text)
    )


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise LedgerError(
                f"{path}: not a usable SQLite ledger ({e}); move it aside to start a fresh run"
            ) from e
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self.set_meta("schema_version", SCHEMA_VERSION)
        elif int(row[0]) != SCHEMA_VERSION:
            raise LedgerError(
                f"{path}: ledger schema {row[0]}, this draftdata writes "
                f"{SCHEMA_VERSION}; use the draftdata version that made it, or move "
                f"{path.parent} aside to start the run afresh"
            )

    def close(self) -> None:
        self.db.close()

    # --- meta ----------------------------------------------------------------------------
    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # --- prompts and work ----------------------------------------------------------------
    def add_prompts(
        self, dataset: str, prompts: Iterable[Prompt], samples: int, turns: Callable[[Prompt], int]
    ) -> None:
        with self.tx():
            for i, p in enumerate(prompts):
                self.db.execute(
                    "INSERT OR IGNORE INTO prompts VALUES (?,?,?,?,?,?)",
                    (
                        dataset,
                        p.id,
                        i,
                        messages_to_json(p.messages),
                        json.dumps(list(p.tools), ensure_ascii=False),
                        json.dumps(p.metadata, ensure_ascii=False, default=str),
                    ),
                )
                for s in range(samples):
                    for t in range(turns(p)):
                        self.db.execute(
                            "INSERT OR IGNORE INTO work (dataset, prompt_id, "
                            "sample_idx, turn) VALUES (?,?,?,?)",
                            (dataset, p.id, s, t),
                        )

    def prompts(self, dataset: str) -> list[Prompt]:
        rows = self.db.execute(
            "SELECT prompt_id, messages_json, tools_json, metadata_json FROM "
            "prompts WHERE dataset=? ORDER BY idx",
            (dataset,),
        ).fetchall()
        return [
            Prompt(
                r[0], dataset, messages_from_json(r[1]), tuple(json.loads(r[2])), json.loads(r[3])
            )
            for r in rows
        ]

    def prompt_ids(self, exclude: str | None = None) -> set[str]:
        rows = self.db.execute(
            "SELECT prompt_id FROM prompts WHERE dataset != ?", (exclude or "",)
        ).fetchall()
        return {r[0] for r in rows}

    def pending(self, dataset: str) -> set[Key]:
        rows = self.db.execute(
            "SELECT dataset, prompt_id, sample_idx, turn FROM work WHERE "
            "dataset=? AND state != 'done'",
            (dataset,),
        ).fetchall()
        return {Key(*r) for r in rows}

    def responses(self, dataset: str) -> dict[Key, StoredResponse]:
        rows = self.db.execute(
            "SELECT dataset, prompt_id, sample_idx, turn, backend, response_json, "
            "output_ids_json, prompt_ids_json, finish_reason, cost_usd, our_prompt_ids_json "
            "FROM responses "
            "WHERE dataset=?",
            (dataset,),
        ).fetchall()
        return {
            Key(*r[:4]): StoredResponse(
                Key(*r[:4]),
                r[4],
                json.loads(r[5]),
                json.loads(r[6]) if r[6] else None,
                json.loads(r[7]) if r[7] else None,
                r[8],
                r[9],
                json.loads(r[10]) if r[10] else None,
            )
            for r in rows
        }

    # --- the write that matters ------------------------------------------------------------
    def record_attempt(
        self,
        key: Key,
        backend: str,
        *,
        ok: bool,
        reason: str | None,
        http_status: int | None,
        started_at: float,
        latency_s: float,
        request: dict[str, Any] | None,
        response_text: str | None,
        stored: dict[str, Any] | None = None,
        final_failure: bool = False,
    ) -> None:
        """One transaction: the attempt (raw request/response verbatim) and, for a success,
        the canonical response and the work state."""
        with self.tx():
            cur = self.db.execute(
                "INSERT INTO attempts (dataset, prompt_id, sample_idx, turn, backend, ok, reason,"
                " http_status, started_at, latency_s, request_json, response_text) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    *key.tuple(),
                    backend,
                    int(ok),
                    reason,
                    http_status,
                    started_at,
                    latency_s,
                    json.dumps(request, ensure_ascii=False) if request is not None else None,
                    response_text,
                ),
            )
            if ok and stored is not None:
                self.db.execute(
                    "INSERT OR IGNORE INTO responses VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        *key.tuple(),
                        cur.lastrowid,
                        backend,
                        json.dumps(stored["response"], ensure_ascii=False),
                        json.dumps(stored.get("output_ids"))
                        if stored.get("output_ids") is not None
                        else None,
                        json.dumps(stored.get("prompt_ids"))
                        if stored.get("prompt_ids") is not None
                        else None,
                        stored["finish_reason"],
                        stored.get("prompt_tokens"),
                        stored.get("completion_tokens"),
                        stored.get("cost_usd", 0.0),
                        stored.get("prompt_drift"),
                        time.time(),
                        json.dumps(stored["our_prompt_ids"])
                        if stored.get("our_prompt_ids") is not None
                        else None,
                    ),
                )
                self.db.execute(
                    "UPDATE work SET state='done', last_error=NULL WHERE dataset=? AND"
                    " prompt_id=? AND sample_idx=? AND turn=?",
                    key.tuple(),
                )
            elif not ok:
                self.db.execute(
                    "UPDATE work SET errors=errors+1, last_error=?, state=? WHERE dataset=? AND "
                    "prompt_id=? AND sample_idx=? AND turn=?",
                    (reason, "failed" if final_failure else "pending", *key.tuple()),
                )

    def tx(self) -> _Tx:
        return _Tx(self.db)

    # --- samples ---------------------------------------------------------------------------
    def put_sample(
        self,
        key: Key,
        token_source: str,
        finish_reason: str,
        input_ids: list[int],
        prompt_len: int,
        warnings: Iterable[str],
    ) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO samples VALUES (?,?,?,?,?,?,?,?,?)",
            (
                *key.tuple(),
                token_source,
                finish_reason,
                json.dumps(input_ids),
                prompt_len,
                json.dumps(list(warnings)),
            ),
        )
        self.db.execute(
            "DELETE FROM drops WHERE dataset=? AND prompt_id=? AND sample_idx=? AND "
            "turn=? AND stage='tokens'",
            key.tuple(),
        )

    def put_drop(self, key: Key, stage: str, reason: str) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO drops VALUES (?,?,?,?,?,?)", (*key.tuple(), stage, reason)
        )

    def iter_samples(
        self, dataset: str
    ) -> Iterator[tuple[Key, str, str, list[int], int, list[str]]]:
        for r in self.db.execute(
            "SELECT dataset, prompt_id, sample_idx, turn, token_source, "
            "finish_reason, input_ids_json, prompt_len, warnings_json FROM "
            "samples WHERE dataset=? ORDER BY prompt_id, sample_idx, turn",
            (dataset,),
        ):
            yield Key(*r[:4]), r[4], r[5], json.loads(r[6]), r[7], json.loads(r[8])

    # --- status ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        ds: dict[str, dict[str, Any]] = {}
        for dataset, state, n in self.db.execute(
            "SELECT dataset, state, count(*) FROM work GROUP BY dataset, state"
        ):
            d = ds.setdefault(
                dataset,
                {
                    "total": 0,
                    "done": 0,
                    "failed": 0,
                    "pending": 0,
                    "duplicates": 0,
                    "errors": {},
                    "cost_usd": 0.0,
                    "attempts": 0,
                    "samples": 0,
                    "drops": {},
                },
            )
            d["total"] += n
            d[state if state in ("done", "failed") else "pending"] += n
        for dataset, n in self.db.execute(
            "SELECT dataset, count(*) FROM (SELECT dataset FROM attempts WHERE ok=1 GROUP BY "
            "dataset, prompt_id, sample_idx, turn HAVING count(*) > 1) GROUP BY dataset"
        ):
            ds[dataset]["duplicates"] = n
        for dataset, reason, n in self.db.execute(
            "SELECT dataset, reason, count(*) FROM attempts WHERE ok=0 GROUP BY dataset, reason"
        ):
            ds[dataset]["errors"][reason] = n
        for dataset, n in self.db.execute(
            "SELECT dataset, count(*) FROM attempts GROUP BY dataset"
        ):
            ds[dataset]["attempts"] = n
        for dataset, cost in self.db.execute(
            "SELECT dataset, sum(cost_usd) FROM responses GROUP BY dataset"
        ):
            ds[dataset]["cost_usd"] = round(cost or 0.0, 6)
        for dataset, n in self.db.execute("SELECT dataset, count(*) FROM samples GROUP BY dataset"):
            ds[dataset]["samples"] = n
        for dataset, reason, n in self.db.execute(
            "SELECT dataset, reason, count(*) FROM drops GROUP BY dataset, reason"
        ):
            ds[dataset]["drops"][reason] = n
        drift = self.db.execute(
            "SELECT dataset, sum(prompt_drift), count(prompt_drift) FROM responses GROUP BY dataset"
        ).fetchall()
        for dataset, bad, checked in drift:
            if checked:
                ds[dataset]["template_drift"] = {"checked": checked, "differs": bad}
        return {"datasets": ds, "cost_usd": round(sum(d["cost_usd"] for d in ds.values()), 6)}


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
