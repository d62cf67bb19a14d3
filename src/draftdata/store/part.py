"""What the parts of a ledger share: its connection, its file, and its transaction. Each part
(``Ledger.meta``, ``.prompts``, ``.answers``, ``.samples``, ``.scores``) reads and writes its
own group of tables over the one connection, so a part's writes join the transaction open on
it, whichever part opened it."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from .guard import error_of

#: a work key's columns, as a WHERE clause
KEY = "dataset=? AND prompt_id=? AND sample_idx=? AND turn=?"


class Part:
    """One part of a ledger: its tables over the ledger's connection."""

    def __init__(self, db: sqlite3.Connection, path: Path, readonly: bool) -> None:
        self.db = db
        self.path = path
        self.readonly = readonly

    def tx(self) -> Tx:
        return Tx(self.db, self.path)


def has_table(db: sqlite3.Connection, name: str) -> bool:
    """Whether the ledger has table ``name`` (a ledger of an older draftdata, read-only, may
    lack one)."""
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,))
    return row.fetchone() is not None


class Tx:
    """One write transaction (``BEGIN IMMEDIATE``): committed when the block ends, rolled back
    when it raises."""

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
                # a failed COMMIT leaves its transaction open, and the next BEGIN would fail
                # on it ("cannot start a transaction within a transaction")
                if self.db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.execute("ROLLBACK")
                raise error_of(Path(self.db_path), e) from e
