"""The spending cap: each request reserves the most it can cost before it is sent, and is
charged what it cost when it is answered. A reservation that could pass the cap waits for the
requests in flight to be charged (each usually costs far less than it reserved); scheduling
stops when it could pass the cap with nothing in flight.

A server can cost more than a reservation: it may ignore ``max_tokens``, or send no ``usage``
(the answer is then charged at the larger of the reservation and its own length). So every
reservation is scaled by the largest overspend seen so far, the first request of a capped run
goes alone, and so does every request once the headroom left is less than a full window of
requests in flight: near the cap nothing is in flight that the cap has not priced at the worst
the server has shown. Where the backend itself bounds what a request can cost (a streamed
answer is hung up on past the runaway limit), the first requests need not go alone: each
reserves that bound until an answer is charged (``bounded``, ``floor``)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class Budget:
    cap_usd: float | None
    spent: float = 0.0
    reserved: float = 0.0
    #: a reservation was refused: the run stopped scheduling because of the cap
    hit: bool = False
    #: the largest cost / reservation seen (>= 1): later reservations are scaled by it
    overspend: float = 1.0
    #: an answer has been charged: until then requests of a capped run go one at a time
    calibrated: bool = False
    _first: asyncio.Lock | None = field(default=None, repr=False)
    #: set when a reservation is released (``reserve_when_free`` waits on it)
    _freed: asyncio.Event | None = field(default=None, repr=False)
    #: what each request being asked holds (by its key): 0 once an attempt that may have been
    #: paid was charged it (the next attempt reserves again: ``reserve_again``)
    _held: dict[Hashable, float] = field(default_factory=dict, repr=False)

    async def hold(self, key: Hashable, estimate: float, floor: float = 0.0) -> bool:
        """``reserve_when_free`` for one request, held under its key until ``let_go``; False
        (nothing held) where the cap is reached."""
        amount = await self.reserve_when_free(estimate, floor)
        if amount is None:
            return False
        self._held[key] = amount
        return True

    def let_go(self, key: Hashable) -> None:
        """The request is over: what it still holds is released."""
        self.release(self._held.pop(key, 0.0))

    def reserve_again(self, key: Hashable, estimate: float, floor: float = 0.0) -> bool:
        """Before an attempt is sent: True where its request still holds its reservation or
        gets a new one now (``reserve_now``), False where the cap leaves no room."""
        if self._held.get(key) != 0.0:
            return True
        amount = self.reserve_now(estimate, floor)
        if amount is None:
            return False
        self._held[key] = amount
        return True

    def charge_unanswered(self, key: Hashable, paid: float, settled: bool) -> float:
        """An attempt that may have been paid and gave no answer (a timeout, a cut
        connection): charged ``paid`` where the server's answer said so (``settled``), else at
        least what its request holds, which goes to it; returns the charge. It tells nothing
        of what answers cost (no calibration)."""
        held = self._held.get(key, 0.0)
        cost = paid if settled else max(paid, held)
        if key in self._held:
            self.release(held)
            self._held[key] = 0.0
        self.spent += cost
        return cost

    async def reserve_when_free(self, estimate: float, floor: float = 0.0) -> float | None:
        """Reserve ``estimate`` (scaled by the overspend seen; at least ``floor``) and return
        what was reserved, to release later; wait while what is in flight holds the room it needs: an answer is
        charged what it cost, usually far less than its reservation (the most it could cost).
        None (and ``hit``) only when it could pass the cap with nothing in flight: refusing at
        once stopped a run at 61% of its cap when its answers came back slowly (more of them
        reserved at once)."""
        while True:
            amount = self.reserve_now(estimate, floor)
            if amount is not None or self.hit:
                return amount
            if self._freed is None:
                self._freed = asyncio.Event()
            self._freed.clear()
            await self._freed.wait()

    def reserve_now(self, estimate: float, floor: float = 0.0) -> float | None:
        """``reserve_when_free`` without the wait: None where there is no room now (and
        ``hit`` where nothing in flight could free any). For the retry of an attempt that
        may have been paid: it is already inside the backend (the capability probe holds
        back the requests behind it, which hold their reservations), so waiting there for
        room could wait for ever."""
        amount = max(estimate * self.overspend, floor)
        if self.cap_usd is None or self.spent + self.reserved + amount <= self.cap_usd:
            self.reserved += amount
            return amount
        if self.reserved <= 1e-12:
            self.hit = True
        return None

    def release(self, amount: float) -> None:
        self.reserved -= amount
        if self._freed is not None:
            self._freed.set()

    def charge(self, cost: float, estimate: float | None = None) -> None:
        self.spent += cost
        if estimate:
            self.overspend = max(self.overspend, cost / estimate)
        self.calibrated = True

    def serial_lock(
        self, estimate: float, window: int, bounded: bool = False
    ) -> asyncio.Lock | None:
        """A lock the request must hold while in flight, or None: one at a time for the first
        request of a capped run (unless ``bounded``: ``estimate`` is the most it can cost,
        whatever the server does), and once ``window`` requests at the overspend seen would not
        fit in what is left."""
        if self.cap_usd is None:
            return None
        left = self.cap_usd - self.spent
        if (self.calibrated or bounded) and window * estimate * self.overspend <= left:
            return None
        if self._first is None:
            self._first = asyncio.Lock()
        return self._first
