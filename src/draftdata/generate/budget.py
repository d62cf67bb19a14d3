"""The spending cap: each request reserves the most it can cost before it is sent, and is
charged what it cost when it is answered. Scheduling stops as soon as spent plus reserved plus
the next reservation could pass the cap."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Budget:
    cap_usd: float | None
    spent: float = 0.0
    reserved: float = 0.0
    #: a reservation was refused: the run stopped scheduling because of the cap
    hit: bool = False

    def reserve(self, estimate: float) -> float | None:
        """Reserve ``estimate``; None (and ``hit``) when it could pass the cap."""
        if self.cap_usd is not None and self.spent + self.reserved + estimate > self.cap_usd:
            self.hit = True
            return None
        self.reserved += estimate
        return estimate

    def release(self, estimate: float) -> None:
        self.reserved -= estimate

    def charge(self, cost: float) -> None:
        self.spent += cost
