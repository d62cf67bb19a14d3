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
