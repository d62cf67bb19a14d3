"""DeepSeek V3 / R1 / V3.1 (and V4 vocabularies)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..records import Message, ToolCall
from ..tokenizers import Tokenizer
from ._common import _between, _text
from .base import ChatFormat, MarkerSpec, ThinkGrammar
from .segments import Segment, Special, Text


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeepSeekV3Format(ChatFormat):
    """DeepSeek V3 / R1 / V3.1. Tool calls use the full-width ``｜`` and ``▁`` control tokens.

    Deliberate differences from the V3 template, which has bugs here: a single tool call is closed
    with ``<｜tool▁calls▁end｜><｜end▁of▁sentence｜>`` (the template closes only the second and later
    calls), and each tool round starts a fresh ``<｜tool▁outputs▁begin｜>``. ``<think>`` markers are
    used where the tokenizer has them (V3.1, V4); otherwise reasoning is written as text (R1)."""

    supports_tools: bool = False

    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for body in _between(segments, "tool_call_begin", "tool_call_end", keep_markers=True):
            m = re.match(r"(.*)\x00tool_sep\x00(.*?)\n```json\n(.*)\n```$", body, re.S)
            if m:
                calls.append(
                    ToolCall(m.group(2), m.group(3), f"call_{len(calls)}", m.group(1) or "function")
                )
        return tuple(calls)

    def render_tool_calls(
        self, calls: Sequence[ToolCall], content: str, tool_text: str = "template"
    ) -> list[Segment]:
        out: list[Segment] = [Special("tool_calls_begin")]
        for i, c in enumerate(calls):
            if i:
                out.append(Text("\n"))
            out += [
                Special("tool_call_begin"),
                Text(c.type),
                Special("tool_sep"),
                Text(c.name + "\n```json\n" + c.arguments + "\n```"),
                Special("tool_call_end"),
            ]
        out.append(Special("tool_calls_end"))
        return out

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        *,
        add_generation_prompt: bool = True,
        thinking: bool = True,
    ) -> list[Segment]:
        self._no_tools(tools)
        system = "\n\n".join(_text(m) for m in messages if m.role == "system")
        out: list[Segment] = [Special("bos"), Text(system)]
        in_tool = False
        for m in messages:
            if m.role == "user":
                in_tool = False
                out += [Special("user"), Text(_text(m))]
            elif m.role == "assistant":
                if in_tool:
                    out.append(Special("tool_outputs_end"))
                else:
                    out.append(Special("assistant"))
                in_tool = False
                if m.tool_calls:
                    out += [Text(_text(m)), *self.render_tool_calls(m.tool_calls, _text(m))]
                else:
                    out.append(Text(_text(m)))
                out.append(Special("eos"))
            elif m.role == "tool":
                if not in_tool:
                    out.append(Special("tool_outputs_begin"))
                else:
                    out.append(Text("\n"))
                out += [Special("tool_output_begin"), Text(_text(m)), Special("tool_output_end")]
                in_tool = True
        if in_tool:
            out.append(Special("tool_outputs_end"))
        elif add_generation_prompt:
            out.append(Special("assistant"))
        return out

    def adapt(self, tokenizer: Tokenizer, ids: dict[str, int]) -> ChatFormat:
        if "think_open" in ids and "think_close" in ids:
            return self
        return self.with_overrides(think=None)


DEEPSEEK_V3 = DeepSeekV3Format(
    name="deepseek-v3",
    tool_section="tool_calls_begin",
    version="1",
    description="DeepSeek V3/R1/V3.1 (and V4 vocabularies): ｜-token roles and tool calls",
    markers={
        "bos": MarkerSpec("<｜begin▁of▁sentence｜>"),
        "eos": MarkerSpec("<｜end▁of▁sentence｜>"),
        "user": MarkerSpec("<｜User｜>"),
        "assistant": MarkerSpec("<｜Assistant｜>"),
        "tool_calls_begin": MarkerSpec("<｜tool▁calls▁begin｜>"),
        "tool_calls_end": MarkerSpec("<｜tool▁calls▁end｜>"),
        "tool_call_begin": MarkerSpec("<｜tool▁call▁begin｜>"),
        "tool_call_end": MarkerSpec("<｜tool▁call▁end｜>"),
        "tool_sep": MarkerSpec("<｜tool▁sep｜>"),
        "tool_outputs_begin": MarkerSpec("<｜tool▁outputs▁begin｜>"),
        "tool_outputs_end": MarkerSpec("<｜tool▁outputs▁end｜>"),
        "tool_output_begin": MarkerSpec("<｜tool▁output▁begin｜>"),
        "tool_output_end": MarkerSpec("<｜tool▁output▁end｜>"),
        "think_open": MarkerSpec("<think>", optional=True),
        "think_close": MarkerSpec("</think>", optional=True),
    },
    end_of_turn="eos",
    think=ThinkGrammar(
        "think_open", "think_close", open_suffix="\n", close_prefix="\n", close_suffix="\n\n"
    ),
)
