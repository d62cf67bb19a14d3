"""The interface every backend implements (the table of kinds is ``config.BACKENDS``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...config import Sampling
from ...records import Completion, FailedAttempt, Key, Message


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
#: awaited before every request is sent: writes it to the ledger as in flight, returns the row
BeforeSend = Callable[[GenRequest], Awaitable[int]]


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


__all__ = ["Backend", "BeforeSend", "Completion", "FailedAttempt", "GenRequest", "OnFailure"]
