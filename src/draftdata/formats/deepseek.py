"""DeepSeek V3 / R1 / V3.1 (and V4 vocabularies)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..records import Message, ToolCall
from ..records.servers import DROPS_CUT_TOOL_SECTIONS, ServerLoss
from ..tokenizers import Tokenizer
from ._common import _between, _text
from .base import ChatFormat, Conversation, ThinkGrammar, version_of
from .markers import MarkerSpec
from .segments import Segment, Special, Text

#: what servers' parsers lose of DeepSeek's grammar for good (``ChatFormat.server_losses``)
SERVER_LOSSES = (
    # vLLM's DeepSeek tool parsers (and SGLang's _process_tool_calls) drop a tool-call section
    # cut by max_tokens and return the text before it (R1's close marker went with it): the
    # view cannot show whether it did
    ServerLoss(DROPS_CUT_TOOL_SECTIONS, "cut", "truncated_tool_call"),
)


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeepSeekV3Format(ChatFormat):
    """DeepSeek V3 / R1 / V3.1. Tool calls use the full-width ``｜`` and ``▁`` control tokens.

    Deliberate differences from the V3 template, which has bugs here: a single tool call is closed
    with ``<｜tool▁calls▁end｜><｜end▁of▁sentence｜>`` (the template closes only the second and later
    calls), and each tool round starts a fresh ``<｜tool▁outputs▁begin｜>``. ``<think>`` markers are
    used where the tokenizer has them (V3.1, V4); otherwise reasoning is written as text (R1)."""

    supports_tools: bool = False
    #: earlier answers are shown with only what follows their last ``</think>`` (R1's template)
    drops_history_reasoning: bool = False

    family: ClassVar[str | None] = "deepseek-v3"

    @property
    def server_losses(self) -> tuple[ServerLoss, ...]:
        return SERVER_LOSSES

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

    # --- prompt hooks ----------------------------------------------------------------------
    def normalise(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        thinking: bool,
        **options: Any,
    ) -> Conversation:
        # system messages are all shown first, wherever they stand; the turns are the rest
        turns = tuple(
            Message(m.role, _answer_only(m), tool_calls=m.tool_calls)
            if m.role == "assistant" and self.drops_history_reasoning
            else m
            for m in messages
            if m.role in ("user", "assistant", "tool")
        )
        return Conversation(
            turns,
            tuple(tools),
            system=tuple(m for m in messages if m.role == "system"),
            add_generation_prompt=add_generation_prompt,
            thinking=thinking,
        )

    def render_head(self, conv: Conversation) -> list[Segment]:
        return [Special("bos"), Text("\n\n".join(_text(m) for m in conv.system))]

    def render_user(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        return [Special("user"), Text(_text(m))]

    def render_assistant(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        # an answer after tool results follows the outputs' end marker, not an Assistant marker
        opening = "tool_outputs_end" if conv.role_before(i) == "tool" else "assistant"
        out: list[Segment] = [Special(opening), Text(_text(m))]
        if m.tool_calls:
            out += self.render_tool_calls(m.tool_calls, _text(m))
        return [*out, Special("eos")]

    def render_tool(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        # each tool round is one outputs-begin ... outputs-end, its results a newline apart
        first = conv.role_before(i) != "tool"
        return [
            Special("tool_outputs_begin") if first else Text("\n"),
            Special("tool_output_begin"),
            Text(_text(m)),
            Special("tool_output_end"),
        ]

    def render_tail(self, conv: Conversation) -> list[Segment]:
        if conv.last_role == "tool":
            return [Special("tool_outputs_end")]
        return super().render_tail(conv)

    def adapt(self, tokenizer: Tokenizer, ids: dict[str, int]) -> ChatFormat:
        # optional think markers the vocabulary lacks (V3's): reasoning is written as text
        th = self.think
        if th is None or all(n in ids or not self.markers[n].optional for n in (th.open, th.close)):
            return self
        return self.with_overrides(think=None)


_THINK = ThinkGrammar(
    "think_open", "think_close", open_suffix="\n", close_prefix="\n", close_suffix="\n\n"
)

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
    think=_THINK,
    generation_prompt="<｜Assistant｜>",
)


#: V3's markers with the think tokens required (R1, V3.1): a vocabulary without them is refused
_THINK_MARKERS = {
    **{k: v for k, v in DEEPSEEK_V3.markers.items() if not k.startswith("think_")},
    "think_open": MarkerSpec("<think>"),
    "think_close": MarkerSpec("</think>"),
}


def _answer_only(m: Message) -> str:
    """An earlier answer as R1's template shows it: what follows its last ``</think>`` (V3.1's
    keeps what follows the first: ``_after_first_close``)."""
    return _text(m).split("</think>")[-1]


#: DeepSeek R1 (the 0528 template): the generation prompt opens ``<think>\n``, the model writes
#: ``REASONING\n</think>\n\nANSWER``; earlier answers are shown without their reasoning (the
#: template keeps what follows ``</think>``). Needs a vocabulary with the think tokens (R1's
#: own, V3.1's, V4's); DeepSeek V3's has none and is refused at bind.
DEEPSEEK_R1 = replace(
    DEEPSEEK_V3,
    name="deepseek-r1",
    description="DeepSeek R1 (0528 template): the prompt opens <think>; earlier reasoning dropped",
    markers=_THINK_MARKERS,
    think=replace(_THINK, prompt_opens=True),
    generation_prompt="<｜Assistant｜><think>\n",
    drops_history_reasoning=True,
)


@dataclass(frozen=True)
class DeepSeekV31Format(DeepSeekV3Format):
    """DeepSeek V3.1, as its own chat template renders it. Thinking opens the generation prompt
    with ``<think>`` (no newline), thinking off closes it (``</think>``); the model writes
    ``REASONING</think>ANSWER``. Tool calls are ``NAME<｜tool▁sep｜>ARGUMENTS`` (V3 wrote
    ``function<｜tool▁sep｜>NAME`` and fenced JSON), no separator between calls.

    History: an answer after a user turn opens with ``<｜Assistant｜></think>`` and shows what
    follows its first ``</think>``; an assistant turn with tool calls writes its content as it
    is, then the calls, the calls-end and end-of-sentence markers; each tool result is wrapped in
    the singular tool-output markers (no outputs-begin around a round), and what the assistant
    says after tool results follows the last tool-output end directly, with no Assistant marker
    and no think block. So a prompt that ends in tool results gets no generation prompt, and the
    answer to it is laid out without think markers (``answer_thinking``). The template ignores
    tool schemas (the model card puts them in the system prompt by hand): they are refused."""

    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for body in _between(segments, "tool_call_begin", "tool_call_end", keep_markers=True):
            name, sep, args = body.partition("\x00tool_sep\x00")
            if sep:
                calls.append(ToolCall(name, args, f"call_{len(calls)}"))
        return tuple(calls)

    def render_tool_calls(
        self, calls: Sequence[ToolCall], content: str, tool_text: str = "template"
    ) -> list[Segment]:
        out: list[Segment] = [Special("tool_calls_begin")]
        for c in calls:
            out += [
                Special("tool_call_begin"),
                Text(c.name),
                Special("tool_sep"),
                Text(c.arguments),
                Special("tool_call_end"),
            ]
        return [*out, Special("tool_calls_end")]

    def render_assistant(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        before = conv.role_before(i)
        out: list[Segment] = []
        if before == "user":
            out += [Special("assistant"), Special("think_close")]
        if m.tool_calls:
            out += [Text(_text(m)), *self.render_tool_calls(m.tool_calls, _text(m))]
        elif before == "tool":
            out.append(Text(_text(m)))
        else:
            out.append(Text(_after_first_close(_text(m))))
        return [*out, Special("eos")]

    def render_tool(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        return [Special("tool_output_begin"), Text(_text(m)), Special("tool_output_end")]

    def render_tail(self, conv: Conversation) -> list[Segment]:
        # only a user turn gets a generation prompt: after tool results the model answers directly
        if conv.add_generation_prompt and conv.last_role == "user":
            return self.generation_prompt_segments(conv.thinking)
        return []

    def answer_thinking(self, messages: Sequence[Message], thinking: bool | None) -> bool | None:
        # after tool results the template opens no think block: the model answers directly
        if messages and messages[-1].role == "tool":
            return False
        return thinking


def _after_first_close(text: str) -> str:
    """An earlier answer as V3.1's template shows it: what follows its first ``</think>``."""
    head, sep, tail = text.partition("</think>")
    return tail if sep else head


DEEPSEEK_V31 = version_of(
    DEEPSEEK_V3,
    DeepSeekV31Format,
    name="deepseek-v3.1",
    description="DeepSeek V3.1: thinking opens <think> in the prompt; NAME<sep>ARGS tool calls",
    markers=_THINK_MARKERS,
    think=ThinkGrammar("think_open", "think_close", prompt_opens=True),
    generation_prompt="<｜Assistant｜><think>",
    generation_prompt_no_think="<｜Assistant｜></think>",
)
