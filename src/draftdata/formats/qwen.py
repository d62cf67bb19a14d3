"""Qwen3 and Qwen3.5/3.6."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

from ..errors import FormatError
from ..records import Message, ToolCall
from ..records.servers import REDUMPS_JSON_ARGUMENTS, ServerLoss
from ._common import _between, _text, _unstring
from .base import ChatFormat, Conversation, ThinkGrammar, separator, tojson
from .markers import MarkerSpec
from .segments import Segment, Special, Text

# ---------------------------------------------------------------------------------------------
_QWEN_MARKERS = {
    "im_start": MarkerSpec("<|im_start|>"),
    "im_end": MarkerSpec("<|im_end|>"),
    "endoftext": MarkerSpec("<|endoftext|>"),
    "think_open": MarkerSpec("<think>"),
    "think_close": MarkerSpec("</think>"),
    "tool_call_open": MarkerSpec("<tool_call>"),
    "tool_call_close": MarkerSpec("</tool_call>"),
    "tool_response_open": MarkerSpec("<tool_response>"),
    "tool_response_close": MarkerSpec("</tool_response>"),
}


def _split_think(content: str) -> tuple[str, str]:
    """Qwen templates' fallback when reasoning is inline: '<think>R</think>C' -> (R, C)."""
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")


def _args_obj(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments)
    except ValueError as e:
        raise FormatError(
            f"tool call {call.name!r} has arguments that are not JSON ({e}); this format renders "
            "arguments from parsed JSON"
        ) from e


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class QwenCalls(Protocol):
    """A Qwen tool-call grammar: how calls are written, read back, and what a server loses."""

    def render(self, calls: Sequence[ToolCall], content: str, tool_text: str) -> list[Segment]: ...

    def parse(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]: ...

    def loss(self, calls: Sequence[ToolCall]) -> str | None: ...

    @property
    def server_losses(self) -> tuple[ServerLoss, ...]: ...


@dataclass(frozen=True)
class JsonCalls:
    """Qwen3's calls: ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``."""

    #: the Hermes-style parsers (vLLM, SGLang) json.loads the call and json.dumps the
    #: arguments again: the model's own spelling of them is gone
    server_losses: ClassVar[tuple[ServerLoss, ...]] = (
        ServerLoss(REDUMPS_JSON_ARGUMENTS, "tool_calls", "arguments_redumped"),
    )

    def parse(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for body in _between(segments, "tool_call_open", "tool_call_close"):
            try:
                obj = json.loads(body.strip())
            except ValueError:
                continue  # a server's parser would leave it as text
            args = obj.get("arguments", {})
            calls.append(
                ToolCall(
                    str(obj.get("name", "")),
                    args if isinstance(args, str) else tojson(args),
                    f"call_{len(calls)}",
                )
            )
        return tuple(calls)

    def loss(self, calls: Sequence[ToolCall]) -> str | None:
        # arguments that are not JSON are written as they came, inside the call's JSON
        # (render): labelled, not dropped. A parser that does not re-dump them may
        # pass on the model's own text, and then the splice is exactly what the model wrote
        # (a call whose arguments are not quite JSON is a thing a model does, and what a
        # drafter should predict); but nothing proves it: the server may have cut or re-spelled
        # them, and a Hermes parser that re-dumps (vLLM, SGLang) never returns them so, which
        # makes such a view altered on the way. A lossy label keeps the sample out of the exact
        # figures and lets a trainer filter it; there is no other rebuild to prefer.
        if any(not _is_json(c.arguments) for c in calls):
            return "arguments_not_json"
        return None

    def render(self, calls: Sequence[ToolCall], content: str, tool_text: str) -> list[Segment]:
        out: list[Segment] = []
        for i, c in enumerate(calls):
            if i == 0:
                out.append(Text(separator("\n", content, tool_text, bool(content))))
            else:
                out.append(Text("\n"))
            out += [
                Special("tool_call_open"),
                Text('\n{"name": "' + c.name + '", "arguments": ' + c.arguments + "}\n"),
                Special("tool_call_close"),
            ]
        return out


@dataclass(frozen=True)
class XmlCalls:
    """Qwen3.5's calls: ``<tool_call><function=NAME><parameter=K>V</parameter></function>
    </tool_call>``, one tag a line."""

    #: a server that re-dumps JSON arguments loses nothing here: the model wrote no JSON
    server_losses: ClassVar[tuple[ServerLoss, ...]] = ()

    def parse(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for body in _between(segments, "tool_call_open", "tool_call_close"):
            m = re.match(r"\s*<function=([^>\n]+)>\n(.*)</function>\s*$", body, re.S)
            if m is None:
                continue
            args = {
                k: _unstring(v)
                for k, v in re.findall(
                    r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n", m.group(2), re.S
                )
            }
            calls.append(ToolCall(m.group(1), tojson(args), f"call_{len(calls)}"))
        return tuple(calls)

    def loss(self, calls: Sequence[ToolCall]) -> str | None:
        # parameters are text between tags; a parser turns them into JSON values by the
        # schema's types (numbers, booleans, objects) and trims the newlines around them: only
        # plain strings without edge newlines come back as the model wrote them
        for c in calls:
            try:
                args = json.loads(c.arguments)
            except ValueError:
                return "arguments_converted"
            if not isinstance(args, dict):
                return "arguments_converted"
            for v in args.values():
                if not isinstance(v, str) or v != v.strip("\n"):
                    return "arguments_converted"
        return None

    def render(self, calls: Sequence[ToolCall], content: str, tool_text: str) -> list[Segment]:
        out: list[Segment] = []
        for i, c in enumerate(calls):
            lead = separator("\n\n", content, tool_text, bool(content.strip())) if i == 0 else "\n"
            out += [Text(lead), Special("tool_call_open")]
            body = "\n<function=" + c.name + ">\n"
            args = _args_obj(c)
            if not isinstance(args, dict):
                raise FormatError(f"tool call {c.name!r}: qwen3.5 needs an arguments object")
            for k, v in args.items():
                val = tojson(v) if isinstance(v, (dict, list)) else _jinja_string(v)
                body += "<parameter=" + k + ">\n" + val + "\n</parameter>\n"
            out += [Text(body + "</function>\n"), Special("tool_call_close")]
        return out


def _jinja_string(v: Any) -> str:
    """Jinja's ``string`` filter on a JSON scalar (Python ``str``: True, None, 1.5)."""
    return str(v)


_TOOL_RESPONSE = ("<tool_response>", "</tool_response>")


@dataclass(frozen=True)
class Qwen3Format(ChatFormat):
    """Qwen3 hybrid thinking: ``<think>\\n R \\n</think>\\n\\n`` and ``<tool_call>`` JSON.
    Reasoning of assistant turns before the last user query is dropped, as the template does.
    Its versions (Qwen3 thinking-only, Qwen3.5) are ``replace(QWEN3, ...)`` over the fields
    below."""

    tools_header: str = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    )
    tools_footer: str = (
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": '
        '<function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    family: ClassVar[str | None] = "qwen3"
    #: the tool calls' grammar (Qwen3: JSON; Qwen3.5: XML-ish parameters)
    call_grammar: QwenCalls = JsonCalls()
    #: the system prompt follows the tool prompt (Qwen3.5) instead of preceding it (Qwen3)
    tools_before_system: bool = False
    #: every answer after the last user query shows a think block, even an empty one (Qwen3.5);
    #: Qwen3 shows one only on the last answer or one with reasoning
    thinks_every_answer: bool = False
    #: what is stripped from the ends of shown reasoning (None: all whitespace, Qwen3.5)
    reasoning_strip: str | None = "\n"
    #: a tool result that comes first opens a user turn (Qwen3.5's template opens none)
    first_tool_opens_turn: bool = True
    #: the refusal of a system message after the first (None: rendered as a system turn)
    late_system: str | None = None

    def tool_block(self, tools: Sequence[dict[str, Any]]) -> list[Segment]:
        """The tool prompt: the template's own words (their marker strings are the markers, as
        the model's tokenizer reads them) around the schemas, which are text: a marker string
        in a tool's name or description never becomes a control id."""
        schemas = "".join("\n" + tojson(t) for t in tools)
        return [*self.lit(self.tools_header), Text(schemas), *self.lit(self.tools_footer)]

    # --- prompt hooks ----------------------------------------------------------------------
    def validate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> None:
        super().validate(messages, tools)
        if self.late_system is not None and any(m.role == "system" for m in messages[1:]):
            raise FormatError(self.late_system)

    def normalise(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        thinking: bool,
        **options: Any,
    ) -> Conversation:
        conv = super().normalise(
            messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking
        )
        # the last user query: reasoning of answers before it is not shown
        msgs = conv.messages
        last_query = len(msgs) - 1
        for i in range(len(msgs) - 1, -1, -1):
            c = _text(msgs[i])
            if msgs[i].role == "user" and not (
                c.startswith(_TOOL_RESPONSE[0]) and c.endswith(_TOOL_RESPONSE[1])
            ):
                last_query = i
                break
        return replace(conv, reasoning_after=last_query)

    def render_head(self, conv: Conversation) -> list[Segment]:
        msgs, tools = conv.messages, conv.tools
        first_sys = bool(msgs) and msgs[0].role == "system"
        sys_text = _text(msgs[0]) if first_sys else ""
        if tools and self.tools_before_system:
            out: list[Segment] = [Special("im_start"), Text("system\n")]
            out += self.tool_block(tools)
            if sys_text:
                out.append(Text("\n\n" + sys_text))
            return [*out, Special("im_end"), Text("\n")]
        if tools:
            body = sys_text + "\n\n" if first_sys else ""
            return [
                Special("im_start"),
                Text("system\n" + body),
                *self.tool_block(tools),
                Special("im_end"),
                Text("\n"),
            ]
        if first_sys:
            return [Special("im_start"), Text("system\n" + sys_text), Special("im_end"), Text("\n")]
        return []

    def render_user(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        return [Special("im_start"), Text(m.role + "\n" + _text(m)), Special("im_end"), Text("\n")]

    def render_system(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        # the first one is in the head's system block
        return self.render_user(conv, i, m) if i > 0 else []

    def render_assistant(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        content = _text(m)
        reasoning = ""
        if m.reasoning is not None:
            reasoning = m.reasoning
        elif "</think>" in content:
            reasoning, content = _split_think(content)
        is_last = i == len(conv.messages) - 1
        out: list[Segment] = [Special("im_start"), Text("assistant\n")]
        if i > conv.reasoning_after and (self.thinks_every_answer or is_last or reasoning):
            out += [
                Special("think_open"),
                Text("\n" + reasoning.strip(self.reasoning_strip) + "\n"),
                Special("think_close"),
                Text("\n\n" + content.lstrip("\n")),
            ]
        else:
            out.append(Text(content))
        if m.tool_calls:
            out += self.render_tool_calls(m.tool_calls, content)
        return [*out, Special("im_end"), Text("\n")]

    def render_tool(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        before = conv.role_before(i)
        opens = before != "tool" if before is not None else self.first_tool_opens_turn
        out: list[Segment] = [Special("im_start"), Text("user")] if opens else []
        out += [
            Text("\n"),
            Special("tool_response_open"),
            Text("\n" + _text(m) + "\n"),
            Special("tool_response_close"),
        ]
        if conv.role_after(i) != "tool":
            out += [Special("im_end"), Text("\n")]
        return out

    # --- response grammar ------------------------------------------------------------------
    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        return self.call_grammar.parse(segments)

    def tool_call_loss(self, calls: Sequence[ToolCall]) -> str | None:
        return self.call_grammar.loss(calls)

    @property
    def server_losses(self) -> tuple[ServerLoss, ...]:
        return self.call_grammar.server_losses

    def render_tool_calls(
        self, calls: Sequence[ToolCall], content: str, tool_text: str = "template"
    ) -> list[Segment]:
        return self.call_grammar.render(calls, content, tool_text)


_THINK = ThinkGrammar(
    "think_open", "think_close", open_suffix="\n", close_prefix="\n", close_suffix="\n\n"
)

QWEN3 = Qwen3Format(
    name="qwen3",
    tool_section="tool_call_open",
    version="1",
    description="Qwen3 hybrid thinking; <tool_call> JSON; reasoning of earlier turns dropped",
    markers=dict(_QWEN_MARKERS),
    end_of_turn="im_end",
    stop_markers=("endoftext",),
    think=_THINK,
    generation_prompt="<|im_start|>assistant\n",
    generation_prompt_no_think="<|im_start|>assistant\n<think>\n\n</think>\n\n",
)

#: Qwen3 thinking-only models (the 2507 ``-Thinking`` releases): the Qwen3 template with the
#: generation prompt opening ``<think>\n`` always (there is no thinking-off switch); the model
#: writes ``REASONING\n</think>\n\nANSWER``
QWEN3_THINKING = replace(
    QWEN3,
    name="qwen3-thinking",
    description="Qwen3 thinking-only (2507 -Thinking): the prompt always opens <think>",
    think=replace(_THINK, prompt_opens=True),
    generation_prompt="<|im_start|>assistant\n<think>\n",
    generation_prompt_no_think=None,
)

#: Qwen3.5/3.6: content trimmed; the generation prompt opens ``<think>\n``; tool calls in
#: XML-ish ``<function=NAME><parameter=K>V</parameter></function>`` blocks, which the model may
#: open inside its reasoning
QWEN35 = replace(
    QWEN3,
    name="qwen3.5",
    description="Qwen3.5/3.6: prompt opens <think>; <function=...><parameter=...> tool calls",
    think=replace(_THINK, prompt_opens=True, tools_in_think=True),
    generation_prompt="<|im_start|>assistant\n<think>\n",
    trim_content=True,
    tools_header="# Tools\n\nYou have access to the following functions:\n\n<tools>",
    tools_footer=(
        "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
        "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
        "\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the "
        "second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>"
        "\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
        "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
        "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
        "function call in natural language BEFORE the function call, but NOT after\n- If there is "
        "no function call available, answer the question like normal with your current knowledge "
        "and do not tell the user about function calls\n</IMPORTANT>"
    ),
    call_grammar=XmlCalls(),
    tools_before_system=True,
    thinks_every_answer=True,
    reasoning_strip=None,
    first_tool_opens_turn=False,
    late_system="qwen3.5: a system message must come first (the template refuses)",
)
