"""Grouped commits: the answers that arrive close together are written in one transaction.

A transaction per answer cost as much CPU as the HTTP request that brought it. Here an answer is
queued and its caller waits; the group is committed when it holds ``most`` answers or ``delay_s``
after its first one, whichever comes first. The guarantee is the same as one transaction each:
an answer counts as done (progress, budget, the conversation's next turn) only once the
transaction holding it has committed. A SIGKILL loses at most the answers of the last
``delay_s``, none of which had been counted; the next run asks for them again."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..records import Completion, Key
from ..store.ledger import Ledger

Answer = tuple[Key, str, Completion, list[int]]


class GroupCommit:
    def __init__(self, ledger: Ledger, *, delay_s: float = 0.005, most: int = 256) -> None:
        self.ledger = ledger
        self.delay_s = delay_s
        self.most = most
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
        if self._intent_call is None:  # the next turn of the loop: the request is waiting on it
            self._intent_call = loop.call_soon(self._flush_intents)
        return await done

    def _flush_intents(self) -> None:
        self._intent_call = None
        intents, self._intents = self._intents, []
        if not intents:
            return
        try:
            ids = self.ledger.answers.begin([i for i, _ in intents])
        except Exception as e:
            for _, started in intents:
                if not started.done():
                    started.set_exception(e)
            return
        for (_, started), row in zip(intents, ids, strict=True):
            if not started.done():
                started.set_result(row)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if len(self._group) >= self.most:
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.delay_s, self.flush)

    async def put(self, answer: Answer) -> None:
        """Returns once ``answer`` is durable; raises the ledger's error if its commit failed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
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
