"""The budget's decision when a reservation does not fit beside those in flight: it waits for
them to be charged (an answer usually costs far less than the most it could, which is what it
reserved) and stops the run only when it cannot fit with nothing in flight. Refused at once, a
run whose answers came back slowly (more of them reserved at once) stopped at 61% of its cap
(test_hostile_servers' budget test, in a suite under load)."""

from __future__ import annotations

import asyncio

from draftdata.generate.budget import Budget


async def _request(budget: Budget, reserve: float, cost: float, log: list[str], name: str) -> None:
    held = await budget.reserve_when_free(reserve)
    if held is None:
        log.append(f"{name} refused")
        return
    log.append(f"{name} sent")
    await asyncio.sleep(0.01)  # in flight
    budget.charge(cost, reserve)
    budget.release(held)


def test_a_reservation_waits_for_those_in_flight_then_fits():
    async def main() -> tuple[Budget, list[str]]:
        budget, log = Budget(1.0, calibrated=True), []
        first = [asyncio.create_task(_request(budget, 0.4, 0.1, log, n)) for n in "ab"]
        await asyncio.sleep(0)  # a and b hold 0.8 of the 1.0
        await _request(budget, 0.4, 0.1, log, "c")  # 0.8 + 0.4 > 1.0: waits, then fits
        await asyncio.gather(*first)
        return budget, log

    budget, log = asyncio.run(main())
    assert log == ["a sent", "b sent", "c sent"]
    assert not budget.hit and abs(budget.spent - 0.3) < 1e-9 and abs(budget.reserved) < 1e-9


def test_a_reservation_that_cannot_fit_with_nothing_in_flight_stops_the_run():
    async def main() -> tuple[Budget, list[str]]:
        budget, log = Budget(1.0, spent=0.5, calibrated=True), []
        await _request(budget, 0.3, 0.3, log, "a")  # 0.8 spent
        await asyncio.gather(*(_request(budget, 0.3, 0.1, log, n) for n in "bc"))
        return budget, log

    budget, log = asyncio.run(main())
    assert log == ["a sent", "b refused", "c refused"]
    assert budget.hit and abs(budget.spent - 0.8) < 1e-9
