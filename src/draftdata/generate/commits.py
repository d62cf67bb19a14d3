"""Grouped commits: the answers that arrive close together are written in one transaction.

A transaction per answer cost as much CPU as the HTTP request that brought it. Here an answer is
queued and its caller waits; the group is committed when it holds ``most`` answers or ``delay_s``
after its first one, whichever comes first. The guarantee is the same as one transaction each:
an answer counts as done (progress, budget, the conversation's next turn) only once the
transaction holding it has committed. A SIGKILL loses at most the answers of the last
``delay_s``, none of which had been counted; the next run asks for them again.

A full disk loses nothing that was paid for, and pays for nothing twice. The writer keeps room on
its disk for the answers in flight (``Reserve``: a file of zeros, freed at the first full-disk
error). From that error on, no new request is sent (its intent is held, unsent); the answers
still on their way are written into the freed room; once none is left in flight, the held
intents fail with the full disk's one line and the run stops. Where even the freed room is too
small, the answers are held in memory and tried again every ``room_every_s`` until there is
room: the run says so, and waits (Ctrl-C stops it; the held answers are then asked again)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..config import Manifest
from ..records import Completion, Key
from ..store.guard import LOW_ROOM, LedgerFull, free_bytes
from ..store.ledger import Ledger

Answer = tuple[Key, str, Completion, list[int]]

#: room kept on a run's disk for each request that may be in flight when it fills: a stored
#: answer (its request and raw response, compressed, and its ids) with room to spare
ROOM_PER_REQUEST = 64 * 1024
#: and for SQLite's write-ahead log and its index
ROOM_BASE = 512 * 1024
#: and no more than this in all (a backend of concurrency 4096 would keep 256 MB)
ROOM_MOST = 64 * 1024 * 1024


class Reserve:
    """Room kept on the run folder's disk: a file of ``size`` bytes (at most ``ROOM_MOST`` and a
    quarter of what is free), freed when the disk fills so that the answers in flight can still
    be written."""

    NAME = ".draftdata.reserve"

    def __init__(self, folder: Path, size: int) -> None:
        self.path = folder / self.NAME
        free = free_bytes(folder) or 0
        self.size = max(0, min(size, ROOM_MOST, (free - LOW_ROOM) // 4))
        try:
            with open(self.path, "wb") as f:
                if self.size:
                    os.posix_fallocate(f.fileno(), 0, self.size)
        except OSError:  # no room for it (or no such call here): nothing kept
            self.free()

    def free(self) -> int:
        """Give the room back; returns the bytes freed."""
        size, self.size = self.size, 0
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
        return size


class GroupCommit:
    def __init__(
        self,
        ledger: Ledger,
        *,
        delay_s: float = 0.005,
        most: int = 256,
        room_every_s: float = 2.0,
        reserve: Reserve | None = None,
        drain_s: float = 600.0,
    ) -> None:
        """``reserve``: the room kept for the answers in flight when the disk fills;
        ``drain_s``: how long they are waited for at most (no request outlives its timeout)."""
        self.ledger = ledger
        self.delay_s = delay_s
        self.most = most
        self.room_every_s = room_every_s
        self.reserve = reserve
        self.drain_s = drain_s
        #: where a line about a full disk goes (the run's progress notes)
        self.say: Callable[[str], None] = lambda _line: None
        #: the disk's error, once it filled: from then on nothing more is sent
        self.full: LedgerFull | None = None
        self._full_at = 0.0
        #: the retry of the held writes while the disk is full; None while writes go through
        self._stalled: asyncio.TimerHandle | None = None
        #: the intents written whose request has no outcome yet (in flight)
        self._open: set[int] = set()
        self._group: list[tuple[Answer, asyncio.Future[None]]] = []
        self._intents: list[tuple[tuple[Key, str, float], asyncio.Future[int]]] = []
        self._intent_call: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def begin(self, key: Key, backend: str, estimate: float) -> int:
        """Write that a request is about to be sent, and wait until that is durable: a request
        in flight when the process dies is then known (``Ledger.answers.settle_interrupted``). The
        requests queued in one turn of the event loop are written in one transaction on the
        next (waiting the answers' 5 ms would hold every request back by it); returns the
        row's id for the outcome to close."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._intents.append(((key, backend, estimate), done))
        if self.full is not None:  # not sent: it fails once nothing paid is left to write
            self._end_if_drained()
        elif self._intent_call is None:  # the next turn of the loop: the request waits on it
            self._intent_call = loop.call_soon(self._flush_intents)
        return await done

    @classmethod
    def for_run(cls, ledger: Ledger, manifest: Manifest) -> GroupCommit:
        """A run's commits: room kept on its disk for every request its backends may have in
        flight, waited for at most as long as the longest of their timeouts."""
        cfgs = list(manifest.backends.values())
        in_flight = sum(getattr(b, "concurrency", 1) for b in cfgs)
        longest = max((getattr(b, "timeout_s", 0.0) for b in cfgs), default=0.0)
        return cls(
            ledger,
            reserve=Reserve(manifest.output_dir, ROOM_BASE + ROOM_PER_REQUEST * in_flight),
            drain_s=longest + 30.0,
        )

    def settled(self, intent: int | None) -> None:
        """A request's attempt ended without an answer (its failure is recorded)."""
        if intent is not None:
            self._open.discard(intent)
            self._end_if_drained()

    def _flush_intents(self) -> None:
        self._intent_call = None
        if self.full is not None:
            return
        intents, self._intents = self._intents, []
        if not intents:
            return
        try:
            ids = self.ledger.answers.begin([i for i, _ in intents])
        except LedgerFull as e:
            if any(not started.done() for _, started in intents):  # not sent: held, unpaid
                self._intents = intents + self._intents
                self.stall(e)
                return
            raise
        except Exception as e:
            for _, started in intents:
                if not started.done():
                    started.set_exception(e)
            return
        self._open.update(ids)
        for (_, started), row in zip(intents, ids, strict=True):
            if not started.done():
                started.set_result(row)

    def stall(self, e: LedgerFull) -> None:
        """The disk is full: nothing more is sent; the reserve's room is freed and the held
        writes are tried again at once, then every ``room_every_s``."""
        first = self.full is None
        if first:
            self.full, self._full_at = e, time.monotonic()
            freed = self.reserve.free() if self.reserve is not None else 0
            self.say(
                f"{e}. Nothing more is sent; the {len(self._open)} answer(s) still on their way "
                f"are written into the room kept for them ({freed / 1e6:.1f} MB), then the run "
                "stops"
            )
        elif self._group:
            self.say(
                f"{self.ledger.path}: the disk is still full: {len(self._group)} paid answer(s) "
                "are held in memory and written once there is room; free space on that disk "
                "(Ctrl-C stops the run, and they are asked again)"
            )
        if self._stalled is None:
            loop = asyncio.get_running_loop()
            self._stalled = loop.call_later(0.0 if first else self.room_every_s, self._retry)

    def _retry(self) -> None:
        self._stalled = None
        self.flush()
        self._end_if_drained()

    def _end_if_drained(self) -> None:
        """Once the disk is full and every paid answer is written (none held, none in flight,
        or ``drain_s`` passed), the requests held unsent fail with the disk's error: the run
        stops with its one line."""
        if self.full is None or self._group:
            return
        if self._open and time.monotonic() - self._full_at < self.drain_s:
            if self._stalled is None:  # look again then: an answer may never come
                loop = asyncio.get_running_loop()
                self._stalled = loop.call_later(self.room_every_s, self._retry)
            return
        intents, self._intents = self._intents, []
        for _, started in intents:
            if not started.done():
                started.set_exception(self.full)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._stalled is not None and self.full is not None:
            return  # the disk filled: the retry writes it with the rest
        if len(self._group) >= self.most:
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.delay_s, self.flush)

    async def put(self, answer: Answer) -> None:
        """Returns once ``answer`` is durable; raises the ledger's error if its commit failed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if answer[2].intent is not None:
            self._open.discard(answer[2].intent)
        self._group.append((answer, done))
        self._schedule(loop)
        await done

    def put_now(self, answers: Sequence[Answer]) -> None:
        """A batch that is already grouped (a local engine's): committed at once, with anything
        queued before it."""
        self.flush()
        self.ledger.answers.record(answers)

    def flush(self) -> None:
        """Commit what is queued. Also called when the run stops (Ctrl-C, an error): an answer
        whose waiter was cancelled is still written, since it was paid for."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        group, self._group = self._group, []
        self._flush_intents()
        if not group:
            return
        try:
            self.ledger.answers.record([a for a, _ in group])
        except LedgerFull as e:
            if any(not done.done() for _, done in group):  # their callers wait: hold them
                self._group = group + self._group
                self.stall(e)
                return
            raise  # nobody is left to hear it (the run is stopping): say it here
        except Exception as e:
            waiting = [done for _, done in group if not done.done()]
            for done in waiting:
                done.set_exception(e)
            if not waiting:  # nobody is left to hear it (the run is stopping): say it here
                raise
            return
        for _, done in group:
            if not done.done():
                done.set_result(None)
        self._end_if_drained()

    def close(self) -> None:
        """The reserve's room given back (the run is over)."""
        if self.reserve is not None:
            self.reserve.free()
