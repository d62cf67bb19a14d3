"""The ledger's schema, and what reads or converts the ledgers of earlier versions."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from . import codec

VERSION = 5
#: versions this draftdata migrates from
MIGRATES_FROM = (2, 3, 4)
#: versions whose columns had other names (read through views, converted by the migration)
RENAMED_BEFORE = 4

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS prompts (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, idx INTEGER NOT NULL,
  messages_json TEXT NOT NULL, tools_json TEXT NOT NULL, metadata_json TEXT NOT NULL,
  first_ids BLOB,
  PRIMARY KEY (dataset, prompt_id));
CREATE INDEX IF NOT EXISTS prompts_order ON prompts (dataset, idx);
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
  request BLOB, response BLOB);
CREATE INDEX IF NOT EXISTS attempts_key ON attempts (dataset, prompt_id, sample_idx, turn);
CREATE TABLE IF NOT EXISTS responses (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, attempt_id INTEGER NOT NULL, backend TEXT NOT NULL,
  response_json TEXT, output_ids BLOB, prompt_ids BLOB,
  finish_reason TEXT NOT NULL, prompt_tokens INTEGER, completion_tokens INTEGER,
  cost_usd REAL NOT NULL DEFAULT 0, prompt_drift INTEGER, created_at REAL NOT NULL,
  our_prompt_ids BLOB, problem TEXT,
  PRIMARY KEY (dataset, prompt_id, sample_idx, turn));
CREATE TABLE IF NOT EXISTS samples (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, token_source TEXT NOT NULL, finish_reason TEXT NOT NULL,
  input_ids BLOB NOT NULL, loss_mask BLOB NOT NULL, prompt_len INTEGER NOT NULL,
  warnings_json TEXT NOT NULL, tokenizer_sha256 TEXT NOT NULL, format_name TEXT NOT NULL,
  format_version TEXT NOT NULL, draftdata_version TEXT NOT NULL,
  PRIMARY KEY (dataset, prompt_id, sample_idx, turn));
CREATE TABLE IF NOT EXISTS scores (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, model TEXT NOT NULL, threshold REAL NOT NULL,
  token_source TEXT NOT NULL, trained INTEGER NOT NULL, sum_logprob REAL NOT NULL,
  min_logprob REAL NOT NULL, flags_json TEXT NOT NULL, repairs_json TEXT NOT NULL,
  created_at REAL NOT NULL,
  PRIMARY KEY (dataset, prompt_id, sample_idx, turn));
CREATE TABLE IF NOT EXISTS inflight (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, backend TEXT NOT NULL, started_at REAL NOT NULL,
  estimate_usd REAL NOT NULL, state TEXT NOT NULL DEFAULT 'open');
CREATE TABLE IF NOT EXISTS drops (
  dataset TEXT NOT NULL, prompt_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
  turn INTEGER NOT NULL, stage TEXT NOT NULL, reason TEXT NOT NULL,
  PRIMARY KEY (dataset, prompt_id, sample_idx, turn, stage));
"""


#: schema-4 columns that had another name in schema 3 (read-only views of an older ledger, and
#: the migration, map them)
RENAMED = {
    "attempts": {"request": "request_json", "response": "response_text"},
    "responses": {
        "output_ids": "output_ids_json",
        "prompt_ids": "prompt_ids_json",
        "our_prompt_ids": "our_prompt_ids_json",
    },
    "samples": {"input_ids": "input_ids_json", "loss_mask": "loss_mask_json"},
}


def columns(sql: str) -> list[str]:
    """Column names of one CREATE TABLE statement of SCHEMA, in order."""
    body = sql[sql.index("(") + 1 : sql.rindex(")")]
    names = []
    for part in body.split(","):
        word = part.strip().split()[0] if part.strip() else ""
        if word and word.isidentifier() and word.upper() not in ("PRIMARY", "KEY"):
            names.append(word)
    return names


def table_sql(name: str) -> str:
    return next(s for s in SCHEMA.split(";") if f"TABLE IF NOT EXISTS {name} " in s)


def old_columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def sources(table: str, have: set[str]) -> list[tuple[str, str]]:
    """Each schema-4 column of ``table`` with the column of an older table that holds it (its
    own name, its schema-3 name, or NULL where the older table has neither)."""
    out = []
    for c in columns(table_sql(table)):
        old = RENAMED[table].get(c, c)
        out.append((c, c if c in have else old if old in have else "NULL"))
    return out


def views_of_old_columns(db: sqlite3.Connection) -> None:
    """Read-only on an older ledger: temporary views (they shadow the tables) that give its
    columns today's names; the codec reads JSON ids where it finds text."""
    for table in RENAMED:
        have = old_columns(db, table)
        if not have:
            continue
        cols = ", ".join(f"{src} AS {c}" for c, src in sources(table, have))
        db.execute(f"CREATE TEMP VIEW {table} AS SELECT {cols} FROM main.{table}")


def _repack_ids(v: Any) -> bytes | None:
    return codec.pack_ids(codec.unpack_ids(v))


def convert_columns(db: sqlite3.Connection) -> None:
    """Schema-3 tables into schema 4 (inside the migration's transaction): each table is
    written again under its new columns and swapped in."""
    packers: dict[str, Callable[[Any], Any]] = {
        "request": codec.pack_text,
        "response": codec.pack_text,
        "output_ids": _repack_ids,
        "prompt_ids": _repack_ids,
        "our_prompt_ids": _repack_ids,
        "input_ids": _repack_ids,
        "loss_mask": lambda v: codec.pack_mask(codec.unpack_mask(v)),
    }
    for table, renamed in RENAMED.items():
        have = old_columns(db, table)
        if not have:
            continue  # samples set aside by 2 -> 3: made again
        cols, select = zip(*sources(table, have), strict=True)
        db.execute(f"ALTER TABLE {table} RENAME TO {table}_v3")
        db.execute(table_sql(table))
        rows = db.execute(f"SELECT {', '.join(select)} FROM {table}_v3")
        fix = [(i, packers[c]) for i, c in enumerate(cols) if c in renamed]
        marks = ",".join("?" * len(cols))
        while batch := rows.fetchmany(1000):
            out = []
            for r in batch:
                row = list(r)
                for i, f in fix:
                    if row[i] is not None:
                        row[i] = f(row[i])
                out.append(row)
            db.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", out)
        db.execute(f"DROP TABLE {table}_v3")
    # the attempts index went with the old table; the ledger runs SCHEMA after a migration
