"""Formats described by per-role strings (ChatML, Llama 3, and TOML-declared ones)."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import FormatError
from ..records import Message
from ..tokenizers import Tokenizer
from ._common import _text
from .base import ChatFormat, Conversation
from .markers import MarkerSpec
from .segments import Segment, Special, Text

_FIELD = re.compile(r"\{(content|role)\}")
_PROBE = "\ue000draftdata-probe\ue001"


@dataclass(frozen=True)
class TemplateFormat(ChatFormat):
    """A format described by per-role strings: ``{role}`` and ``{content}`` are text fields, every
    marker text inside the strings is a control token. Declarable in TOML without code."""

    bos: str | None = None
    message: dict[str, str] = field(default_factory=dict)
    #: a system message the template inserts when the conversation has none; ``"auto"`` reads it
    #: from the tokenizer's own chat template when the format is bound
    default_system: str | None = None
    supports_tools: bool = False

    def fill(self, template: str, **fields: str) -> list[Segment]:
        out: list[Segment] = []
        for part in self._parsed(template):
            if isinstance(part, str):
                out.append(Text(fields[part]))
            else:
                out += part
        return out

    @functools.cached_property
    def _templates(self) -> dict[str, tuple[str | tuple[Segment, ...], ...]]:
        return {}

    def _parsed(self, template: str) -> tuple[str | tuple[Segment, ...], ...]:
        """A message template as its literal segments and the names of its fields, split once."""
        got = self._templates.get(template)
        if got is None:
            parts: list[str | tuple[Segment, ...]] = []
            pos = 0
            for m in _FIELD.finditer(template):
                parts += [tuple(self.lit(template[pos : m.start()])), m.group(1)]
                pos = m.end()
            parts.append(tuple(self.lit(template[pos:])))
            got = tuple(parts)
            if len(self._templates) < 256:
                self._templates[template] = got
        return got

    # --- prompt hooks ----------------------------------------------------------------------
    def _with_default_system(self, messages: Sequence[Message]) -> list[Message]:
        msgs = list(messages)
        if self.default_system not in (None, "auto") and (not msgs or msgs[0].role != "system"):
            msgs.insert(0, Message("system", self.default_system))
        return msgs

    def validate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> None:
        super().validate(messages, tools)
        for m in self._with_default_system(messages):
            if (self.message.get(m.role) or self.message.get("default")) is None:
                raise FormatError(f"format {self.name} has no template for role {m.role!r}")
            if m.role == "assistant" and m.tool_calls:
                raise FormatError(f"format {self.name} has no tool-call grammar")

    def normalise(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        thinking: bool,
        **options: Any,
    ) -> Conversation:
        return super().normalise(
            self._with_default_system(messages),
            tools,
            add_generation_prompt=add_generation_prompt,
            thinking=thinking,
        )

    def render_head(self, conv: Conversation) -> list[Segment]:
        return [Special(self.bos)] if self.bos else []

    def render_user(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        """Every role: its template (or the default one), the content filled in as text."""
        tpl = self.message.get(m.role) or self.message["default"]
        return self.fill(tpl, role=m.role, content=_text(m))

    render_system = render_assistant = render_tool = render_other = render_user

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
    import jinja2.sandbox  # only where a template asks for its default system message

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
