"""Ledger errors as one line that names the fix: a full disk, a damaged page, a file that is
not a ledger. Every method of a ledger's parts that touches the file is wrapped with
``guarded``."""

from __future__ import annotations

import contextlib
import functools
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


def explain(path: Path, e: sqlite3.Error) -> str:
    """One line for a sqlite error on ``path``: what happened and the fix."""
    text = str(e)
    if "full" in text:
        return (
            f"{path}: the disk is full ({text}); free space and run the same command again: "
            "every answer stored so far is kept"
        )
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
            raise LedgerError(explain(self.path, e)) from e

    return inner


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """For readers outside ``store`` that query a ledger: a sqlite error in the block (a damaged
    page the open did not touch) is one LedgerError line."""
    try:
        yield
    except sqlite3.Error as e:
        raise LedgerError(explain(path, e)) from e
