"""The built-in chat formats. Each renders exactly what its model's chat template renders, with
user, system, tool and model text kept as text. Differences from a template are deliberate and
listed in the class docstring."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
import jinja2.sandbox

from ..errors import FormatError
from ..records import Message, ToolCall
from ..tokenizers import Tokenizer
from .base import ChatFormat, MarkerSpec, ThinkGrammar, tojson
from .segments import Segment, Special, Text

_FIELD = re.compile(r"\{(content|role)\}")
_PROBE = "\ue000draftdata-probe\ue001"


def _text(m: Message) -> str:
    return m.content or ""


@dataclass(frozen=True)
class TemplateFormat(ChatFormat):
    """A format described by per-role strings: ``{role}`` and ``{content}`` are text fields, every
    marker text inside the strings is a control token. Declarable in TOML without code."""

    bos: str | None = None
    message: dict[str, str] = field(default_factory=dict)
    generation_prompt: str = ""
    generation_prompt_no_think: str | None = None
    #: a system message the template inserts when the conversation has none; ``"auto"`` reads it
    #: from the tokenizer's own chat template when the format is bound
    default_system: str | None = None
    trim_content: bool = False
    supports_tools: bool = False

    def fill(self, template: str, **fields: str) -> list[Segment]:
        out: list[Segment] = []
        pos = 0
        for m in _FIELD.finditer(template):
            out += self.lit(template[pos : m.start()])
            out.append(Text(fields[m.group(1)]))
            pos = m.end()
        out += self.lit(template[pos:])
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
        out: list[Segment] = [Special(self.bos)] if self.bos else []
        msgs = list(messages)
        if self.default_system not in (None, "auto") and (not msgs or msgs[0].role != "system"):
            msgs.insert(0, Message("system", self.default_system))
        for m in msgs:
            tpl = self.message.get(m.role) or self.message.get("default")
            if tpl is None:
                raise FormatError(f"format {self.name} has no template for role {m.role!r}")
            if m.role == "assistant" and m.tool_calls:
                raise FormatError(f"format {self.name} has no tool-call grammar")
            content = _text(m).strip() if self.trim_content else _text(m)
            out += self.fill(tpl, role=m.role, content=content)
        if add_generation_prompt:
            gp = self.generation_prompt
            if not thinking and self.generation_prompt_no_think is not None:
                gp = self.generation_prompt_no_think
            out += self.lit(gp)
        return out

    def adapt(self, tokenizer: Tokenizer, ids: dict[str, int]) -> ChatFormat:
        if self.default_system != "auto":
            return self
        return self.with_overrides(default_system=probe_default_system(self, tokenizer))


def probe_default_system(fmt: TemplateFormat, tokenizer: Tokenizer) -> str | None:
    """Read the system message a chat template inserts when a conversation has none (SmolLM2's
    'You are a helpful AI assistant named SmolLM, ...'), by rendering it once on a probe."""
    tpl = tokenizer.chat_template
    if not tpl:
        return None
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        rendered = env.from_string(tpl).render(
            messages=[{"role": "user", "content": _PROBE}],
            add_generation_prompt=False,
            bos_token="",
            eos_token="",
        )
    except jinja2.TemplateError:
        return None
    head = rendered.split(_PROBE, 1)[0]
    sys_open = "".join(
        s.text if isinstance(s, Text) else fmt.markers[s.marker].text
        for s in fmt.fill(
            fmt.message.get("system") or fmt.message.get("default", ""), role="system", content="\0"
        )
    )
    before, _, after = sys_open.partition("\0")
    if before and head.startswith(before) and after and after in head:
        return head[len(before) : head.index(after, len(before))]
    return None


def _between(
    segments: Sequence[Segment], open_m: str, close_m: str, keep_markers: bool = False
) -> list[str]:
    """Texts between ``open_m`` and ``close_m`` markers; inner markers appear as ``\\0name\\0``
    when ``keep_markers``."""
    out: list[str] = []
    cur: list[str] | None = None
    for seg in segments:
        if isinstance(seg, Special) and seg.marker == open_m:
            cur = []
        elif isinstance(seg, Special) and seg.marker == close_m:
            if cur is not None:
                out.append("".join(cur))
            cur = None
        elif cur is not None:
            if isinstance(seg, Text):
                cur.append(seg.text)
            elif keep_markers:
                cur.append(f"\x00{seg.marker}\x00")
    return out


def _unstring(v: str) -> Any:
    """Invert Jinja's ``string``/``tojson`` rendering of a Qwen3.5 parameter value."""
    special = {"True": True, "False": False, "None": None}
    if v in special:
        return special[v]
    try:
        return json.loads(v)
    except ValueError:
        return v


# ---------------------------------------------------------------------------------------------
CHATML = TemplateFormat(
    name="chatml",
    version="1",
    description="ChatML (SmolLM2 and other <|im_start|>/<|im_end|> models); a default system "
    "prompt is read from the tokenizer's chat template when it has one",
    markers={"im_start": MarkerSpec("<|im_start|>"), "im_end": MarkerSpec("<|im_end|>")},
    end_of_turn="im_end",
    message={"default": "<|im_start|>{role}\n{content}<|im_end|>\n"},
    generation_prompt="<|im_start|>assistant\n",
    default_system="auto",
)

LLAMA3 = TemplateFormat(
    name="llama3",
    version="1",
    description="Llama 3 instruct (header ids, <|eot_id|>); content is trimmed as the template does",
    markers={
        "bos": MarkerSpec("<|begin_of_text|>"),
        "start_header": MarkerSpec("<|start_header_id|>"),
        "end_header": MarkerSpec("<|end_header_id|>"),
        "eot": MarkerSpec("<|eot_id|>"),
        "end_of_text": MarkerSpec("<|end_of_text|>"),
    },
    end_of_turn="eot",
    stop_markers=("end_of_text",),
    bos="bos",
    message={"default": "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"},
    generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n",
    trim_content=True,
)


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


@dataclass(frozen=True)
class Qwen3Format(ChatFormat):
    """Qwen3 hybrid thinking: ``<think>\\n R \\n</think>\\n\\n`` and ``<tool_call>`` JSON.
    Reasoning of assistant turns before the last user query is dropped, as the template does."""

    tools_header: str = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    )
    tools_footer: str = (
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": '
        '<function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )

    def _last_query(self, messages: Sequence[Message]) -> int:
        for i in range(len(messages) - 1, -1, -1):
            m = messages[i]
            c = self._content(m)
            if m.role == "user" and not (
                c.startswith("<tool_response>") and c.endswith("</tool_response>")
            ):
                return i
        return len(messages) - 1

    def _content(self, m: Message) -> str:
        return _text(m)

    def _system_block(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]
    ) -> list[Segment]:
        out: list[Segment] = []
        first_sys = bool(messages) and messages[0].role == "system"
        if tools:
            body = self._content(messages[0]) + "\n\n" if first_sys else ""
            out += [Special("im_start"), Text("system\n" + body)]
            out += self.lit(
                self.tools_header + "".join("\n" + tojson(t) for t in tools) + self.tools_footer
            )
            out += [Special("im_end"), Text("\n")]
        elif first_sys:
            out += [
                Special("im_start"),
                Text("system\n" + self._content(messages[0])),
                Special("im_end"),
                Text("\n"),
            ]
        return out

    def _assistant_body(
        self, m: Message, idx: int, last_query: int, is_last: bool
    ) -> list[Segment]:
        content = self._content(m)
        reasoning = ""
        if m.reasoning is not None:
            reasoning = m.reasoning
        elif "</think>" in content:
            reasoning, content = _split_think(content)
        out: list[Segment] = [Special("im_start"), Text("assistant\n")]
        if idx > last_query and (is_last or reasoning):
            out += [
                Special("think_open"),
                Text("\n" + reasoning.strip("\n") + "\n"),
                Special("think_close"),
                Text("\n\n" + content.lstrip("\n")),
            ]
        else:
            out.append(Text(content))
        if m.tool_calls:
            out += self.render_tool_calls(m.tool_calls, content)
        return out

    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
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

    def render_tool_calls(self, calls: Sequence[ToolCall], content: str) -> list[Segment]:
        out: list[Segment] = []
        for i, c in enumerate(calls):
            if (i == 0 and content) or i > 0:
                out.append(Text("\n"))
            out += [
                Special("tool_call_open"),
                Text('\n{"name": "' + c.name + '", "arguments": ' + c.arguments + "}\n"),
                Special("tool_call_close"),
            ]
        return out

    def _gen_prompt(self, thinking: bool) -> list[Segment]:
        out: list[Segment] = [Special("im_start"), Text("assistant\n")]
        if not thinking:
            out += [Special("think_open"), Text("\n\n"), Special("think_close"), Text("\n\n")]
        return out

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        *,
        add_generation_prompt: bool = True,
        thinking: bool = True,
    ) -> list[Segment]:
        out = self._system_block(messages, tools)
        last_query = self._last_query(messages)
        n = len(messages)
        for i, m in enumerate(messages):
            if m.role == "user" or (m.role == "system" and i > 0):
                out += [
                    Special("im_start"),
                    Text(m.role + "\n" + self._content(m)),
                    Special("im_end"),
                    Text("\n"),
                ]
            elif m.role == "assistant":
                out += self._assistant_body(m, i, last_query, i == n - 1)
                out += [Special("im_end"), Text("\n")]
            elif m.role == "tool":
                if i == 0 or messages[i - 1].role != "tool":
                    out += [Special("im_start"), Text("user")]
                out += [
                    Text("\n"),
                    Special("tool_response_open"),
                    Text("\n" + self._content(m) + "\n"),
                    Special("tool_response_close"),
                ]
                if i == n - 1 or messages[i + 1].role != "tool":
                    out += [Special("im_end"), Text("\n")]
        if add_generation_prompt:
            out += self._gen_prompt(thinking)
        return out


QWEN3 = Qwen3Format(
    name="qwen3",
    tool_section="tool_call_open",
    version="1",
    description="Qwen3 hybrid thinking; <tool_call> JSON; reasoning of earlier turns dropped",
    markers=dict(_QWEN_MARKERS),
    end_of_turn="im_end",
    stop_markers=("endoftext",),
    think=ThinkGrammar(
        "think_open", "think_close", open_suffix="\n", close_prefix="\n", close_suffix="\n\n"
    ),
    template_kwargs={},
)


@dataclass(frozen=True)
class Qwen35Format(Qwen3Format):
    """Qwen3.5/3.6: content trimmed; the generation prompt opens ``<think>\\n``; tool calls in
    XML-ish ``<function=NAME><parameter=K>V</parameter></function>`` blocks."""

    tools_header: str = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
    tools_footer: str = (
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
    )

    def _content(self, m: Message) -> str:
        return _text(m).strip()

    def _system_block(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]
    ) -> list[Segment]:
        first_sys = bool(messages) and messages[0].role == "system"
        sys_text = self._content(messages[0]) if first_sys else ""
        if tools:
            out: list[Segment] = [Special("im_start"), Text("system\n")]
            out += self.lit(
                self.tools_header + "".join("\n" + tojson(t) for t in tools) + self.tools_footer
            )
            if sys_text:
                out.append(Text("\n\n" + sys_text))
            return [*out, Special("im_end"), Text("\n")]
        if first_sys:
            return [Special("im_start"), Text("system\n" + sys_text), Special("im_end"), Text("\n")]
        return []

    def _assistant_body(
        self, m: Message, idx: int, last_query: int, is_last: bool
    ) -> list[Segment]:
        content = self._content(m)
        reasoning = ""
        if m.reasoning is not None:
            reasoning = m.reasoning
        elif "</think>" in content:
            reasoning, content = _split_think(content)
        reasoning = reasoning.strip()
        out: list[Segment] = [Special("im_start"), Text("assistant\n")]
        if idx > last_query:
            out += [
                Special("think_open"),
                Text("\n" + reasoning + "\n"),
                Special("think_close"),
                Text("\n\n" + content),
            ]
        else:
            out.append(Text(content))
        if m.tool_calls:
            out += self.render_tool_calls(m.tool_calls, content)
        return out

    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
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

    def render_tool_calls(self, calls: Sequence[ToolCall], content: str) -> list[Segment]:
        out: list[Segment] = []
        for i, c in enumerate(calls):
            lead = ("\n\n" if content.strip() else "") if i == 0 else "\n"
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

    def _gen_prompt(self, thinking: bool) -> list[Segment]:
        out: list[Segment] = [Special("im_start"), Text("assistant\n"), Special("think_open")]
        if not thinking:
            return [*out, Text("\n\n"), Special("think_close"), Text("\n\n")]
        return [*out, Text("\n")]

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        *,
        add_generation_prompt: bool = True,
        thinking: bool = True,
    ) -> list[Segment]:
        if any(m.role == "system" for m in messages[1:]):
            raise FormatError("qwen3.5: a system message must come first (the template refuses)")
        out = self._system_block(messages, tools)
        last_query = self._last_query(messages)
        n = len(messages)
        for i, m in enumerate(messages):
            if m.role == "user":
                out += [
                    Special("im_start"),
                    Text("user\n" + self._content(m)),
                    Special("im_end"),
                    Text("\n"),
                ]
            elif m.role == "assistant":
                out += self._assistant_body(m, i, last_query, i == n - 1)
                out += [Special("im_end"), Text("\n")]
            elif m.role == "tool":
                if i > 0 and messages[i - 1].role != "tool":
                    out += [Special("im_start"), Text("user")]
                out += [
                    Text("\n"),
                    Special("tool_response_open"),
                    Text("\n" + self._content(m) + "\n"),
                    Special("tool_response_close"),
                ]
                if i == n - 1 or messages[i + 1].role != "tool":
                    out += [Special("im_end"), Text("\n")]
        if add_generation_prompt:
            out += self._gen_prompt(thinking)
        return out


def _jinja_string(v: Any) -> str:
    """Jinja's ``string`` filter on a JSON scalar (Python ``str``: True, None, 1.5)."""
    return str(v)


QWEN35 = Qwen35Format(
    name="qwen3.5",
    tool_section="tool_call_open",
    version="1",
    description="Qwen3.5/3.6: prompt opens <think>; <function=...><parameter=...> tool calls",
    markers=dict(_QWEN_MARKERS),
    end_of_turn="im_end",
    stop_markers=("endoftext",),
    think=ThinkGrammar(
        "think_open",
        "think_close",
        open_suffix="\n",
        close_prefix="\n",
        close_suffix="\n\n",
        prompt_opens=True,
    ),
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

    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for body in _between(segments, "tool_call_begin", "tool_call_end", keep_markers=True):
            m = re.match(r"(.*)\x00tool_sep\x00(.*?)\n```json\n(.*)\n```$", body, re.S)
            if m:
                calls.append(
                    ToolCall(m.group(2), m.group(3), f"call_{len(calls)}", m.group(1) or "function")
                )
        return tuple(calls)

    def render_tool_calls(self, calls: Sequence[ToolCall], content: str) -> list[Segment]:
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


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KimiK2Format(ChatFormat):
    """Kimi K2 / K2.5. The generation prompt ends with ``<think>`` (thinking) or
    ``<think></think>`` (thinking off); history turns are rendered with empty ``<think></think>``
    unless they come after the last plain assistant turn (``preserve_thinking`` keeps them all)."""

    def _role(self, m: Message) -> list[Segment]:
        role = {"user": "im_user", "assistant": "im_assistant"}.get(m.role, "im_system")
        return [Special(role), Text(m.name or m.role), Special("im_middle")]

    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        for body in _between(segments, "tool_call_begin", "tool_call_end", keep_markers=True):
            call_id, sep, args = body.partition("\x00tool_call_arg_begin\x00")
            if sep:
                name = call_id.removeprefix("functions.").rsplit(":", 1)[0]
                calls.append(ToolCall(name, args, call_id))
        return tuple(calls)

    def render_tool_calls(self, calls: Sequence[ToolCall], content: str) -> list[Segment]:
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

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        *,
        add_generation_prompt: bool = True,
        thinking: bool = True,
        preserve_thinking: bool = False,
    ) -> list[Segment]:
        out: list[Segment] = []
        if tools:
            out += [
                Special("im_system"),
                Text("tool_declare"),
                Special("im_middle"),
                Text(tojson(list(tools), separators=(",", ":"))),
                Special("im_end"),
            ]
        split = -1
        if not preserve_thinking:
            for i in range(len(messages) - 1, -1, -1):
                if messages[i].role == "assistant" and not messages[i].tool_calls:
                    split = i
                    break
        for i, m in enumerate(messages):
            out += self._role(m)
            if m.role == "assistant":
                if i <= split or not thinking:
                    out += [Special("think_open"), Special("think_close")]
                else:
                    out += [Special("think_open"), Text(m.reasoning or ""), Special("think_close")]
                out.append(Text(_text(m)))
                if m.tool_calls:
                    out += self.render_tool_calls(m.tool_calls, _text(m))
            elif m.role == "tool":
                out.append(Text(f"## Return of {m.tool_call_id}\n{_text(m)}"))
            else:
                out.append(Text(_text(m)))
            out.append(Special("im_end"))
        if add_generation_prompt:
            out += [
                Special("im_assistant"),
                Text("assistant"),
                Special("im_middle"),
                Special("think_open"),
            ]
            if not thinking:
                out.append(Special("think_close"))
        return out


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
)

BUILTIN: dict[str, ChatFormat] = {
    f.name: f for f in (CHATML, LLAMA3, QWEN3, QWEN35, DEEPSEEK_V3, KIMI_K2)
}
