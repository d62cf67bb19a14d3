"""One small interface per backend, registered by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...manifest import Sampling
from ...records import ApiView, Message
from ...store.ledger import Key


@dataclass(frozen=True)
class GenRequest:
    key: Key
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]
    prompt_ids: list[int]
    sampling: Sampling
    seed: int


@dataclass
class Completion:
    """One successful answer, with everything the ledger stores verbatim."""

    request: dict[str, Any] | None
    response: dict[str, Any]
    response_text: str
    finish_reason: str
    view: ApiView
    output_ids: list[int] | None = None
    prompt_ids: list[int] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float = 0.0
    http_status: int | None = None
    started_at: float = 0.0
    latency_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FailedAttempt:
    reason: str
    http_status: int | None
    request: dict[str, Any] | None
    response_text: str | None
    started_at: float
    latency_s: float
    final: bool


#: called for every failed attempt the moment it ends (the ledger stores it verbatim)
OnFailure = Callable[[GenRequest, FailedAttempt], None]


class Backend(ABC):
    kind: ClassVar[str]
    #: True when the backend returns the model's exact token ids
    exact_ids: bool = False

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

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "exact_ids": self.exact_ids}
