"""Ledger errors as one line that names the fix: a full disk, a damaged page, a file that is
not a ledger. Every method of a ledger's parts that touches the file is wrapped with
``guarded``.

A full disk is its own error (``LedgerFull``): its fix is to free space, never to move the ledger
aside (that would throw away every paid answer), and a writer waits on it rather than stopping
(``generate.commits``). SQLite reports it as ``SQLITE_FULL``, or, where it could not grow the
``-shm`` index of its write-ahead log, as a plain ``disk I/O error``: that one is told apart by
the free space left beside the ledger."""

from __future__ import annotations

import contextlib
import functools
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from ..errors import DraftdataError

P = ParamSpec("P")
R = TypeVar("R")


class _OnFile(Protocol):
    @property
    def path(self) -> Path: ...


S = TypeVar("S", bound=_OnFile)


class LedgerError(DraftdataError):
    """The ledger file is unusable."""


class LedgerFull(LedgerError):
    """The disk holding the ledger is full: free space, and the same command goes on."""


#: below this many free bytes beside a ledger, an I/O error of SQLite's is taken as a full disk,
#: and a ledger is not opened for writing at all: SQLite maps its ``-shm`` index into memory,
#: and a page of it that the full disk cannot back kills the process (SIGBUS, no message)
LOW_ROOM = 256 * 1024
#: SQLite's primary result codes for an I/O error and a full disk
SQLITE_IOERR, SQLITE_FULL = 10, 13


def free_bytes(path: Path) -> int | None:
    """Bytes free to this user on the disk holding ``path`` (a file or folder); None where that
    cannot be told."""
    for p in (path, *path.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return None


def _mb(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 1e6:.2f} MB"


def full_line(path: Path, detail: str = "") -> str:
    """The one line for a full disk under ``path`` (the ledger): free space; never move it."""
    why = f"{detail}; " if detail else ""
    return (
        f"{path}: the disk is full ({why}{_mb(free_bytes(path))} free); free space on it and "
        "run the same command again: the ledger keeps every answer stored so far (do not move "
        "it aside)"
    )


def low_room(path: Path) -> bool:
    """Whether less than ``LOW_ROOM`` is free on the disk holding ``path`` (False where that
    cannot be told)."""
    free = free_bytes(path)
    return free is not None and free < LOW_ROOM


def is_full(path: Path, e: sqlite3.Error) -> bool:
    """Whether ``e`` on ``path`` is a full disk: SQLite's ``SQLITE_FULL``, or an I/O error with
    less than ``LOW_ROOM`` free beside the ledger."""
    code = getattr(e, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == SQLITE_FULL or "disk is full" in str(e):
        return True
    if primary == SQLITE_IOERR or "disk I/O error" in str(e):
        return low_room(path)
    return False


def error_of(path: Path, e: sqlite3.Error) -> LedgerError:
    """``e`` as the ledger error that names its fix: ``LedgerFull`` for a full disk."""
    if is_full(path, e):
        return LedgerFull(full_line(path, str(e)))
    return LedgerError(explain(path, e))


def explain(path: Path, e: sqlite3.Error) -> str:
    """One line for a sqlite error on ``path`` that is not a full disk (``error_of`` tells that
    apart first): what happened and the fix."""
    text = str(e)
    if "malformed" in text or "not a database" in text or "damaged" in text:
        return (
            f"{path}: the ledger is damaged ({text}); restore it from a backup, or move "
            f"{path.parent} aside to start the run afresh"
        )
    return f"{path}: the ledger cannot be written ({text}); check the disk and rerun"


def guarded(fn: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """``fn`` (a method of a ledger part) with every sqlite error turned into one LedgerError
    line."""

    @functools.wraps(fn)
    def inner(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(self, *args, **kwargs)
        except sqlite3.Error as e:
            raise error_of(self.path, e) from e

    return inner


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """For readers outside ``store`` that query a ledger: a sqlite error in the block (a damaged
    page the open did not touch) is one LedgerError line."""
    try:
        yield
    except sqlite3.Error as e:
        raise error_of(path, e) from e
