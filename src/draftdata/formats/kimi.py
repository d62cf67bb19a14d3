"""Kimi K2 / K2.5."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..records import Message, ToolCall
from ..records.servers import (
    RENUMBERS_TOOL_CALL_IDS,
    STRIPS_REASONING_END_WHITESPACE,
    STRIPS_TOOL_CALL_WHITESPACE,
    ServerLoss,
)
from ._common import _between, _text
from .base import ChatFormat, Conversation, ThinkGrammar, tojson
from .markers import MarkerSpec
from .segments import Segment, Special, Text

#: a tool-call id in the model's own form
_MODEL_ID = re.compile(r"functions\.[^:\s]+:\d+")

#: what servers' parsers lose of Kimi's grammar for good (``ChatFormat.server_losses``)
SERVER_LOSSES = (
    # vLLM's and SGLang's Kimi parsers match whitespace around the id and the arguments
    ServerLoss(STRIPS_TOOL_CALL_WHITESPACE, "tool_calls", "tool_whitespace_stripped"),
    # vLLM's Kimi parser strips the whitespace that ends the reasoning: `.\n</think>` comes
    # back as `.</think>`, and the grammar has no whitespace there to restore
    ServerLoss(STRIPS_REASONING_END_WHITESPACE, "think", "think_whitespace"),
    # providers rewrite ids (``call_...``) and SGLang numbers them with its own counter: every
    # id that is not the model's numbering is rebuilt (``model_ids``)
    ServerLoss(RENUMBERS_TOOL_CALL_IDS, "ids", "tool_call_ids_rebuilt"),
)


@functools.lru_cache(maxsize=256)
def _role_segments(role: str, shown: str) -> tuple[Segment, ...]:
    """A message's opening (segments are immutable, so one tuple serves every message)."""
    marker = {"user": "im_user", "assistant": "im_assistant"}.get(role, "im_system")
    return (Special(marker), Text(shown), Special("im_middle"))


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KimiK2Format(ChatFormat):
    """Kimi K2 / K2.5. The generation prompt ends with ``<think>`` (thinking) or
    ``<think></think>`` (thinking off); history turns are rendered with empty ``<think></think>``
    unless they come after the last plain assistant turn (``preserve_thinking`` keeps them all)."""

    prompt_options: ClassVar[frozenset[str]] = frozenset({"preserve_thinking"})
    family: ClassVar[str | None] = "kimi-k2"

    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for body in _between(segments, "tool_call_begin", "tool_call_end", keep_markers=True):
            call_id, sep, args = body.partition("\x00tool_call_arg_begin\x00")
            if sep:
                name = call_id.removeprefix("functions.").rsplit(":", 1)[0]
                calls.append(ToolCall(name, args, call_id))
        return tuple(calls)

    @property
    def server_losses(self) -> tuple[ServerLoss, ...]:
        return SERVER_LOSSES

    def model_ids(
        self, calls: Sequence[ToolCall], history: Sequence[Message], renumbered: bool
    ) -> tuple[tuple[ToolCall, ...], int]:
        # Kimi writes ``functions.NAME:N``, N counting the conversation's tool calls from 0
        # (Moonshot's tool-call guidance); an id not in that form was rewritten on the way
        n = sum(len(m.tool_calls) for m in history if m.role == "assistant")
        out: list[ToolCall] = []
        rebuilt = 0
        for i, c in enumerate(calls):
            own = f"functions.{c.name}:{n + i}"
            if c.id != own and (renumbered or not _MODEL_ID.fullmatch(c.id or "")):
                c = replace(c, id=own)
                rebuilt += 1
            out.append(c)
        return tuple(out), rebuilt

    def render_tool_calls(
        self, calls: Sequence[ToolCall], content: str, tool_text: str = "template"
    ) -> list[Segment]:
        out: list[Segment] = [Special("tool_calls_begin")]
        for c in calls:
            out += [
                Special("tool_call_begin"),
                Text(c.id or ""),
                Special("tool_call_arg_begin"),
                Text(c.arguments),
                Special("tool_call_end"),
            ]
        return [*out, Special("tool_calls_end")]

    # --- prompt hooks ----------------------------------------------------------------------
    def normalise(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        thinking: bool,
        preserve_thinking: bool = False,
        **options: Any,
    ) -> Conversation:
        conv = super().normalise(
            messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking
        )
        if preserve_thinking:
            return conv
        # reasoning is shown only after the last answer without tool calls
        split = -1
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].role == "assistant" and not messages[i].tool_calls:
                split = i
                break
        return replace(conv, reasoning_after=split)

    def render_head(self, conv: Conversation) -> list[Segment]:
        if not conv.tools:
            return []
        return [
            Special("im_system"),
            Text("tool_declare"),
            Special("im_middle"),
            Text(tojson(list(conv.tools), separators=(",", ":"))),
            Special("im_end"),
        ]

    def render_user(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        return [*_role_segments(m.role, m.name or m.role), Text(_text(m)), Special("im_end")]

    render_system = render_other = render_user

    def render_assistant(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        out: list[Segment] = list(_role_segments(m.role, m.name or m.role))
        if i > conv.reasoning_after and conv.thinking:
            out += [Special("think_open"), Text(m.reasoning or ""), Special("think_close")]
        else:
            out += [Special("think_open"), Special("think_close")]
        out.append(Text(_text(m)))
        if m.tool_calls:
            out += self.render_tool_calls(m.tool_calls, _text(m))
        return [*out, Special("im_end")]

    def render_tool(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        return [
            *_role_segments(m.role, m.name or m.role),
            Text(f"## Return of {m.tool_call_id}\n{_text(m)}"),
            Special("im_end"),
        ]


KIMI_K2 = KimiK2Format(
    name="kimi-k2",
    tool_section="tool_calls_begin",
    version="2.5",
    description="Kimi K2/K2.5: <|im_user|>/<|im_assistant|> roles, generation prompt opens "
    "<think>, tool calls in <|tool_calls_section_begin|>",
    markers={
        "im_end": MarkerSpec("<|im_end|>"),
        "im_user": MarkerSpec("<|im_user|>"),
        "im_assistant": MarkerSpec("<|im_assistant|>"),
        "im_system": MarkerSpec("<|im_system|>"),
        "im_middle": MarkerSpec("<|im_middle|>"),
        "think_open": MarkerSpec("<think>"),
        "think_close": MarkerSpec("</think>"),
        "tool_calls_begin": MarkerSpec("<|tool_calls_section_begin|>"),
        "tool_calls_end": MarkerSpec("<|tool_calls_section_end|>"),
        "tool_call_begin": MarkerSpec("<|tool_call_begin|>"),
        "tool_call_arg_begin": MarkerSpec("<|tool_call_argument_begin|>"),
        "tool_call_end": MarkerSpec("<|tool_call_end|>"),
    },
    end_of_turn="im_end",
    think=ThinkGrammar("think_open", "think_close", prompt_opens=True),
    generation_prompt="<|im_assistant|>assistant<|im_middle|><think>",
    generation_prompt_no_think="<|im_assistant|>assistant<|im_middle|><think></think>",
)
