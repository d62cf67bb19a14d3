"""The spending cap: each request reserves the most it can cost before it is sent, and is
charged what it cost when it is answered. Scheduling stops as soon as spent plus reserved plus
the next reservation could pass the cap.

A server can cost more than a reservation: it may ignore ``max_tokens``, or send no ``usage``
(the answer is then charged at the larger of the reservation and its own length). So every
reservation is scaled by the largest overspend seen so far, the first request of a capped run
goes alone, and so does every request once the headroom left is less than a full window of
requests in flight: near the cap nothing is in flight that the cap has not priced at the worst
the server has shown."""

from __future__ import annotations

import asyncio
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

    def reserve(self, estimate: float) -> float | None:
        """Reserve ``estimate`` (scaled by the overspend seen); None (and ``hit``) when it
        could pass the cap. Returns what was reserved, to release later."""
        amount = estimate * self.overspend
        if self.cap_usd is not None and self.spent + self.reserved + amount > self.cap_usd:
            self.hit = True
            return None
        self.reserved += amount
        return amount

    def release(self, amount: float) -> None:
        self.reserved -= amount

    def charge(self, cost: float, estimate: float | None = None) -> None:
        self.spent += cost
        if estimate:
            self.overspend = max(self.overspend, cost / estimate)
        self.calibrated = True

    def serial_lock(self, estimate: float, window: int) -> asyncio.Lock | None:
        """A lock the request must hold while in flight, or None: one at a time for the first
        request of a capped run, and once ``window`` requests at the overspend seen would not
        fit in what is left."""
        if self.cap_usd is None:
            return None
        left = self.cap_usd - self.spent
        if self.calibrated and window * estimate * self.overspend <= left:
            return None
        if self._first is None:
            self._first = asyncio.Lock()
        return self._first
