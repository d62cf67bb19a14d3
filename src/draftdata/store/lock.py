"""One writer per run folder: an exclusive lock held for the life of the process that writes
(``generate``, ``run``, ``export``) and freed by the OS however it ends, kill -9 included. A
second writer is refused at once, naming the holder; readers (``status``, ``report``, ``plan``)
take no lock and work beside a writer."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

from ..errors import DraftdataError

LOCK_NAME = ".draftdata.lock"


class RunBusyError(DraftdataError):
    """Another process is writing to this run folder."""


#: how long a refused writer waits for the holder to write its name (it locks, then writes)
HOLDER_WAIT_S = 2.0


def _holder(f: IO[str]) -> str:
    """The holder's line; it may not be written yet when the lock was taken a moment ago."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        f.seek(0)
        line = f.read().strip()
        if line or time.monotonic() > deadline:
            return line or "another process"
        time.sleep(0.01)


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_NAME
        self._f: IO[str] | None = None

    def acquire(self, what: str) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(f)
            f.close()
            raise RunBusyError(
                f"{self.path.parent} is in use by {holder}; wait for it to finish or stop it "
                "(two writers would pay for the same prompts twice)"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} ({what})\n")
        f.flush()
        self._f = f
        return self

    def release(self) -> None:
        if self._f is not None:
            self._f.close()  # closing the file frees the lock
            self._f = None
