"""Typed records passed between stages. Frozen dataclasses; no untyped dicts between stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
TokenSource = Literal["engine", "logprobs", "reconstructed"]
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class ToolCall:
    """One function call made by the assistant. ``arguments`` is the JSON text, kept verbatim."""

    name: str
    arguments: str
    id: str | None = None
    type: str = "function"


@dataclass(frozen=True)
class Message:
    role: Role
    content: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Prompt:
    id: str
    dataset: str
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Provenance:
    tokenizer_sha256: str
    format_name: str
    format_version: str
    draftdata_version: str


@dataclass(frozen=True)
class LogprobToken:
    """One generated token as a server reports it in ``logprobs``: its text, maybe its raw
    bytes (OpenAI ``bytes``), maybe its id (vLLM ``token_id:N`` with return_tokens_as_token_ids)."""

    token: str
    bytes: tuple[int, ...] | None = None
    id: int | None = None


@dataclass(frozen=True)
class ApiView:
    """What an OpenAI-compatible API returned for one choice, normalised across providers."""

    content: str | None
    finish_reason: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[LogprobToken, ...] | None = None
    #: which provider field the reasoning came from (reasoning, reasoning_content, ...)
    reasoning_field: str | None = None


@dataclass(frozen=True)
class Sample:
    """Token ids a trainer consumes: ``input_ids`` = prompt ids + response ids, ``loss_mask``
    True exactly on the response ids (including the end-of-turn marker when the answer ended)."""

    id: str
    input_ids: list[int]
    loss_mask: list[bool]
    prompt_len: int
    token_source: TokenSource
    finish_reason: str
    provenance: Provenance
    dataset: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def response_ids(self) -> list[int]:
        return self.input_ids[self.prompt_len :]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError("input_ids and loss_mask differ in length")
