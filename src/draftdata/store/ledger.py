"""The run ledger: one SQLite file (WAL) per run. ``store`` is the only code in draftdata that
speaks SQL; this module opens the file, and its parts (``meta``, ``prompts``, ``answers``,
``samples``, ``scores``: a module each) read and write its tables.

It holds the prompts, every attempt with the raw request and raw response stored verbatim the
moment they arrive, one canonical response per (dataset, prompt, sample, turn), the work state,
usage and cost, and the samples made from the responses with their provenance. A response and its
work state are written in one transaction, so a SIGKILL at any moment loses nothing that was
acknowledged and never stores a response twice.

Schema history: 2 kept samples without provenance or mask; 3 keeps both; 4 stores ids as int32
BLOBs and raw bodies compressed, and a response's raw body once (in its attempt); 5 compresses
with zstd, not zlib (a schema-4 row is read as it is), and keeps each prompt's first turn
rendered to ids (``prompts.first_ids``, NULL in a migrated ledger's rows). A version-2
ledger is migrated when it is opened for writing: its samples are derived data without
provenance, so they are set aside and made again by the tokens stage (the responses are kept as
they are); a version-3 ledger's columns are converted in place. Opened read-only, an older
ledger is read as it is, through views that give its columns today's names."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from . import schema
from .answers import INTERRUPTED, Answers
from .guard import LedgerError, LedgerFull, full_line, is_full, low_room
from .meta import MIGRATED_FROM, SCHEMA_VERSION, Meta
from .part import Tx
from .prompts import Prompts
from .samples import Samples
from .scores import Scores

__all__ = ["INTERRUPTED", "Ledger", "LedgerError"]


def _no_log(path: Path) -> bool:
    """Whether the ledger has no write-ahead log to replay (closed cleanly)."""
    wal = path.with_name(path.name + "-wal")
    return not wal.exists() or not wal.stat().st_size


def _open_read_only(path: Path) -> sqlite3.Connection:
    """``path`` opened read-only. A WAL ledger needs its ``-shm`` file, which SQLite makes
    beside it when missing: on a read-only mount it cannot, so a ledger with no write-ahead
    log to replay is opened ``immutable`` (no one can write to that folder either). On a full
    disk SQLite cannot back that file either (SIGBUS, or an I/O error): a ledger closed cleanly
    is read ``immutable`` (no writer can commit on a full disk), and one with a log to replay
    is refused in one line."""
    uri = path.resolve().as_uri()
    if low_room(path):
        if _no_log(path):
            return sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True, timeout=30)
        raise LedgerFull(full_line(path, "reading its write-ahead log needs room beside it"))
    db = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=30)
    try:
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return db
    except sqlite3.OperationalError:
        db.close()
        if os.access(path.parent, os.W_OK):  # a writer may be at work: never read past it
            raise
        if _no_log(path):
            return sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True, timeout=30)
        raise LedgerError(
            f"{path}: its write-ahead log cannot be read in a read-only folder; copy the run "
            "folder to a writable place and read it there"
        ) from None


def _open_for_writing(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    if low_room(path):  # refused before SQLite maps an index the disk cannot back
        raise LedgerFull(full_line(path))
    db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


class Ledger:
    """``Ledger(path)`` opens (or creates) a run's ledger for writing; ``Ledger.read(path)``
    opens an existing one read-only, beside a writer. The ledger owns the connection, the
    schema and its migrations, and the transaction (``tx``); what it stores is read and written
    through its parts, each over a group of tables:

    - ``meta``: what one stage leaves for another (the gate, each dataset's settings and read
      drops, the manifest, ...), as the typed records of ``store.meta``;
    - ``prompts``: the prompts and their work keys, with what is still to ask;
    - ``answers``: attempts, responses and requests in flight, and each key's outcome;
    - ``samples``: the tokens stage's samples and drops;
    - ``scores``: the model stage's scores and repairs."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
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
            self.db = _open_read_only(path) if readonly else _open_for_writing(path)
            self.meta = Meta(self.db, path, readonly)
            self.prompts = Prompts(self.db, path, readonly)
            self.answers = Answers(self.db, path, readonly, self.meta)
            self.samples = Samples(self.db, path, readonly)
            self.scores = Scores(self.db, path, readonly)
            version = self.meta.schema_version()
            if readonly:
                if version is not None and version < schema.RENAMED_BEFORE:
                    schema.views_of_old_columns(self.db)
            else:
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
            if is_full(path, e):
                raise LedgerFull(full_line(path, str(e))) from e
            if readonly:
                raise LedgerError(f"{path}: not a readable draftdata ledger ({e})") from e
            raise LedgerError(
                f"{path}: not a usable SQLite ledger ({e}); move it aside to start a fresh run"
            ) from e
        if version is None and not readonly:
            self.meta.put(SCHEMA_VERSION, schema.VERSION)
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

    def _migrate(self, version: int) -> None:
        """2 -> 3: samples gain provenance and their mask. The old rows carry neither, so they
        are set aside and the tokens stage makes them again from the stored responses.
        3 -> 4: ids become int32 BLOBs and raw bodies compressed, row by row.
        4 -> 5: prompts gain ``first_ids`` (NULL: rendered on the request path, as before);
        nothing is converted (the codec reads a zlib row where it finds one)."""
        with self.tx():
            if version == 2:
                self.db.execute("ALTER TABLE responses ADD COLUMN problem TEXT")
                self.db.execute("DROP TABLE IF EXISTS samples")
                self.db.execute("DELETE FROM drops WHERE stage='tokens'")
            if version < schema.RENAMED_BEFORE:
                schema.convert_columns(self.db)
            if "first_ids" not in schema.old_columns(self.db, "prompts"):
                self.db.execute("ALTER TABLE prompts ADD COLUMN first_ids BLOB")
            self.meta.put(SCHEMA_VERSION, schema.VERSION)
            self.meta.put(MIGRATED_FROM, version)

    def close(self) -> None:
        self.db.close()

    def tx(self) -> Tx:
        """One write transaction over every part (``BEGIN IMMEDIATE``)."""
        return Tx(self.db, self.path)
