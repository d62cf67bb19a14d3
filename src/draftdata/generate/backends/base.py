"""The interface every backend implements (the table of kinds is ``config.BACKENDS``).

A kind's behaviour lives on its class, never in a switch elsewhere: besides answering
(``run_batch``), what ``draftdata plan`` asks before any backend is made (``cost_usd``,
``preflight``: classmethods over the manifest's table, so nothing is loaded or connected to) and
what the budget reserves per request (``max_cost``)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import Manifest, Sampling
from ...records import Completion, FailedAttempt, Key, Message


@dataclass(frozen=True)
class Began:
    """When an attempt began: the wall clock's time (what the ledger shows as its start) and
    the monotonic clock's, which its duration is measured from: a wall clock set back a day or
    forward ten years during a run changes no stored duration."""

    wall: float
    mono: float

    @classmethod
    def now(cls) -> Began:
        return cls(time.time(), time.monotonic())

    def elapsed(self) -> float:
        return time.monotonic() - self.mono


@dataclass(frozen=True)
class GenRequest:
    """One request: the conversation, its tools, our rendering of the prompt, and how to sample."""

    key: Key
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]
    prompt_ids: list[int]
    sampling: Sampling
    seed: int


#: called for every failed attempt the moment it ends (the ledger stores it verbatim)
OnFailure = Callable[[GenRequest, FailedAttempt], None]
#: awaited before every request is sent: writes it to the ledger as in flight, returns the row;
#: raises ``BudgetRefused`` where the budget has no room left for the attempt
BeforeSend = Callable[[GenRequest], Awaitable[int]]


class BudgetRefused(Exception):
    """The budget has no room for another attempt of a request (its reservation went to an
    earlier attempt that may have been paid): the request is not sent, and stays pending."""


class Backend(ABC):
    kind: ClassVar[str]
    #: local engines answer every conversation's turn t in batches, then turn t+1; API backends
    #: run a pool of ``concurrency`` conversations, each turn by turn
    batches_turns: ClassVar[bool] = False
    batch_size: int = 1
    concurrency: int = 1
    #: set when no retry can help (a refused key): the runner stops the dataset and says this
    fatal: str | None = None
    #: set by the runner: every request is written to the ledger before it is sent
    before_send: BeforeSend | None = None

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def run_batch(
        self, requests: Sequence[GenRequest], on_failure: OnFailure
    ) -> Awaitable[list[Completion | None]]:
        """Answer a batch; None for a request whose attempts all failed."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass

    def max_cost(self, req: GenRequest) -> float:
        """The most one request can cost (local engines: nothing)."""
        return 0.0

    def worst_cost(self, req: GenRequest) -> float | None:
        """What a request can cost at worst where the backend bounds it (hangs up on an answer
        past a limit), even from a server that ignores ``max_tokens``; None where nothing does."""
        return None

    @classmethod
    def cost_usd(cls, cfg: Any, prompt_tokens: float, completion_tokens: float) -> float:
        """What this many prompt and completion tokens cost at the prices in ``cfg``, the
        manifest's table for this kind (local engines: nothing)."""
        return 0.0

    @classmethod
    def preflight(cls, name: str, cfg: Any, m: Manifest) -> list[str]:
        """What would stop or waste a run on backend ``name`` (an unset key, a server that does
        not answer, a model that is not there), found without sending a request: one line each,
        starting "backend NAME: "."""
        return []


def model_path_problems(name: str, model_path: str, m: Manifest) -> list[str]:
    """A local engine's preflight: its model file or folder is there (``pkg:`` paths are
    resolved when the engine loads)."""
    if model_path.startswith("pkg:") or m.resolve(model_path).exists():
        return []
    return [f"backend {name}: model_path {m.resolve(model_path)} does not exist"]


__all__ = ["Backend", "BeforeSend", "Completion", "FailedAttempt", "GenRequest", "OnFailure"]
