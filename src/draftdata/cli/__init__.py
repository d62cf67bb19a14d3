"""The command layer: parse arguments, call the library, print, map errors to exit codes.

One module per command group; ``app`` holds what they share. Importing the groups registers
their commands. Every error leaves through ``main`` as one line: a ``DraftdataError`` with its
own exit code, a usage error (exit 2) naming the fix, Ctrl-C (exit 130) saying what was kept."""

from __future__ import annotations

import errno
import faulthandler
import gc
import os
import re
import signal
import sys
import types
from pathlib import Path
from typing import Any

import click

from ..errors import DraftdataError
from . import (  # noqa: F401  (registers the commands)
    audit,
    contamination,
    evaluate,
    hidden,
    model,
    plan,
    run_job,
    tokens,
)
from .app import app, err, say


def _exception_modules() -> tuple[types.ModuleType, ...]:
    """click's exceptions, and those of the copy of click that typer bundles (not click's)."""
    try:
        from typer._click import exceptions as bundled
    except ImportError:  # pragma: no cover - a typer that uses click itself
        return (click.exceptions,)
    return (click.exceptions, bundled)


_MODULES = _exception_modules()
INTERRUPTED = (
    "interrupted: everything answered so far is in the ledger; run the same command again to resume"
)


def _classes(name: str) -> tuple[type[Exception], ...]:
    return tuple({getattr(m, name) for m in _MODULES if hasattr(m, name)})


def usage_line(e: Any) -> str:
    """One line for a click usage error: what is wrong, the usage, and where help is."""
    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None else "draftdata"
    msg = re.sub(r"\s+", " ", e.format_message()).strip()
    usage = ""
    if ctx is not None:
        usage = re.sub(r"\s+", " ", ctx.get_usage()).strip().replace("Usage: ", "usage: ")
        usage = re.sub(r"\{(\w[\w.-]*)\}", r"\1", usage)  # typer writes arguments as {NAME}
    return f"{path}: {msg}" + (f" ({usage}; see `{path} --help`)" if usage else "")


def one_line(message: str) -> str:
    """``message`` on one line: a library's text (SQLite's integrity check) may hold newlines."""
    return re.sub(r"\s*\n\s*", " ", message.strip())


def _named(e: OSError) -> str:
    """The path an OSError is about: its filename, or the one quoted in its text (pyarrow's)."""
    if e.filename2 is not None:  # os.replace(tmp, target): the target is what the user named
        return str(e.filename2)
    if e.filename is not None:
        return str(e.filename)
    m = re.search(r"'([^']+)'", str(e))
    return m.group(1) if m else "a file"


#: an OSError about a path the user chose, by errno: (what is wrong, the fix), said in one line
#: with exit 2 like any other bad input
_PATH_ERRORS = {
    errno.EROFS: (
        "is on a read-only file system",
        "write to a folder you can write to (another -o or [run] output, or a copy of the run)",
    ),
    errno.EACCES: (
        "is not writable or readable by this user",
        "fix its permissions or use another",
    ),
    errno.EPERM: ("is not writable or readable by this user", "fix its permissions or use another"),
    errno.EISDIR: ("is a folder where a file belongs", "name a file, or move the folder aside"),
    errno.EEXIST: ("is a file where a folder belongs", "move the file aside or choose another"),
    errno.ENOTDIR: ("has a file where a folder belongs", "move the file aside or choose another"),
}


def _broken_link(path: Path) -> str | None:
    """The line for a symlink that leads nowhere (to a path that does not exist, or round in
    a loop) where a folder belongs; None where ``path`` is not one."""
    if not path.is_symlink() or path.exists():
        return None
    target = os.readlink(path)
    try:
        path.resolve(strict=True)
        loop = False
    except RuntimeError:  # a loop (Python 3.11 raises this for one)
        loop = True
    except OSError as e:
        loop = e.errno == errno.ELOOP
    if loop:
        return f"{path} is a symlink loop (to {target}); remove it or choose another folder"
    return (
        f"{path} is a symlink to {target}, which does not exist; create that folder, remove "
        "the link, or choose another folder"
    )


def os_error_line(e: OSError) -> tuple[str, int]:
    """One line for an OSError that reached the boundary, and the exit code: a full disk
    (exit 1: free space and rerun) or a path the user chose that cannot be used (exit 2);
    anything else as the OS said it (exit 1)."""
    if e.errno == errno.ENOSPC:
        return (
            f"the disk is full ({e.filename or 'writing'}); free space and run the same command "
            "again: everything stored so far is kept",
            1,
        )
    if e.errno in (errno.EEXIST, errno.ELOOP) and (broken := _broken_link(Path(_named(e)))):
        return broken, 2
    if e.errno in _PATH_ERRORS:
        what, fix = _PATH_ERRORS[e.errno]
        path = Path(_named(e))
        if e.errno == errno.EROFS and path.name.startswith("."):  # a temporary name, a lock
            path = path.parent
        detail = f" ({e.strerror})" if e.filename is not None and e.strerror else ""
        return f"{path} {what}{detail}; {fix}", 2
    return one_line(str(e)), 1


_INTERRUPTS: tuple[type[BaseException], ...] = (*_classes("Abort"), KeyboardInterrupt)


#: the collector's youngest generation is collected after this many container allocations
#: (Python's default is 700). A record allocates hundreds of containers (its JSON, messages,
#: segments, pieces), nearly all freed by reference counting, so the default ran a collection
#: every couple of records and the older generations' passes walked each window's live
#: objects: 12% of a `reconstruct` worker's time (llama3 ShareGPT, -j 2: 3.85 -> 3.60 s wall,
#: peak memory unchanged at 220 MB). Forked workers inherit it.
GC_THRESHOLD = (50_000, 20, 100)


def main() -> None:
    gc.set_threshold(*GC_THRESHOLD)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID`: every thread's stack on stderr
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        rv = app(standalone_mode=False, prog_name="draftdata")
    except DraftdataError as e:
        say(err, f"error: {one_line(str(e))}", "bold red")
        sys.exit(e.exit_code)
    except _INTERRUPTS:
        say(err, INTERRUPTED, "yellow")
        sys.exit(130)
    except _classes("Exit") as e:
        sys.exit(getattr(e, "exit_code", 0))
    except _classes("UsageError") as e:
        say(err, f"error: {usage_line(e)}", "bold red")
        sys.exit(2)
    except _classes("ClickException") as e:
        say(err, f"error: {e.format_message()}", "bold red")  # type: ignore[attr-defined]
        sys.exit(getattr(e, "exit_code", 1))
    except OSError as e:  # the disk, the network, a file: one line, and what to do
        line, code = os_error_line(e)
        say(err, f"error: {line}", "bold red")
        sys.exit(code)
    except Exception as e:  # a bug: one line, and the traceback only on request
        if os.environ.get("DRAFTDATA_DEBUG"):
            raise
        say(
            err,
            f"internal error: {type(e).__name__}: {one_line(str(e))} (a bug in draftdata; "
            "rerun with DRAFTDATA_DEBUG=1 for the traceback and report it)",
            "bold red",
        )
        sys.exit(70)
    if rv == 130:  # typer turns a KeyboardInterrupt into Exit(130), silently
        say(err, INTERRUPTED, "yellow")
    if isinstance(rv, int):
        sys.exit(rv)


__all__ = ["INTERRUPTED", "app", "main"]
