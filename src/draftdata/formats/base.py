"""Chat formats: prompt rendering to segments, the response grammar, and markers bound by text."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, TypeVar

from ..errors import FormatError, MarkerError
from ..records import FINISHED, Message, ToolCall
from ..records.servers import LossPart, ServerLoss
from ..tokenizers import Tokenizer
from .markers import MarkerCheck, MarkerSpec, check_marker
from .segments import Segment, Special, Text, merge_text, segments_text, train


@dataclass(frozen=True)
class ThinkGrammar:
    """Where reasoning sits in a response: ``{open}{open_suffix}REASONING{close_prefix}{close}
    {close_suffix}CONTENT``. ``prompt_opens`` means the generation prompt already ends with
    ``{open}{open_suffix}`` (Kimi K2.5, Qwen3.5), so the model's output starts inside the reasoning."""

    open: str
    close: str
    open_suffix: str = ""
    close_prefix: str = ""
    close_suffix: str = ""
    prompt_opens: bool = False
    #: the model may open its tool-call section inside the reasoning, without the close marker
    #: (Qwen3.5: servers' parsers take the tool-call marker as the implicit end of reasoning)
    tools_in_think: bool = False


def tojson(obj: Any, separators: tuple[str, str] | None = None) -> str:
    """JSON exactly as HF chat templates print it (``tojson``: no ASCII escaping, keys unsorted)."""
    return json.dumps(obj, ensure_ascii=False, separators=separators)


@dataclass(frozen=True)
class Conversation:
    """A conversation after a format's normaliser: the messages its role hooks render, in order,
    and what the format read off the whole conversation once (so no hook scans it again)."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    #: system messages the normaliser took out of the turns (DeepSeek shows them all first)
    system: tuple[Message, ...] = ()
    add_generation_prompt: bool = True
    thinking: bool = True
    #: answers after this index show their reasoning (Qwen: after the last user query; Kimi:
    #: after the last plain answer); -1: every answer does
    reasoning_after: int = -1

    def role_before(self, i: int) -> str | None:
        return self.messages[i - 1].role if i > 0 else None

    def role_after(self, i: int) -> str | None:
        return self.messages[i + 1].role if i + 1 < len(self.messages) else None

    @property
    def last_role(self) -> str | None:
        return self.messages[-1].role if self.messages else None


@dataclass(frozen=True)
class ChatFormat:
    """Base class. ``render_prompt`` is one loop for every family: ``validate`` refuses what the
    format cannot show, ``normalise`` turns the messages into a ``Conversation``, then
    ``render_head``, one role hook per message (``render_system`` / ``render_user`` /
    ``render_assistant`` / ``render_tool``, ``render_other`` for any other role) and
    ``render_tail`` (the generation prompt). A family supplies only its hooks; a version of a
    format is ``dataclasses.replace(BASE, name=..., <what differs>)``."""

    name: str
    version: str
    description: str
    markers: dict[str, MarkerSpec]
    end_of_turn: str
    stop_markers: tuple[str, ...] = ()
    think: ThinkGrammar | None = None
    supports_tools: bool = True
    #: the marker that opens the tool-call section of an answer (None: no tool grammar)
    tool_section: str | None = None
    #: the generation prompt, as template text (marker texts in it are markers)
    generation_prompt: str = ""
    #: the generation prompt with thinking off (None: the format has no thinking switch)
    generation_prompt_no_think: str | None = None
    #: message content is shown stripped of surrounding whitespace (Llama 3, Qwen3.5)
    trim_content: bool = False
    #: prompt options beyond ``add_generation_prompt`` and ``thinking`` (Kimi's
    #: ``preserve_thinking``); ``normalise`` takes them
    prompt_options: ClassVar[frozenset[str]] = frozenset()

    # --- helpers --------------------------------------------------------------------------
    @functools.cached_property
    def _marker_pattern(self) -> tuple[dict[str, str], re.Pattern[str]]:
        """Marker text -> name, and the compiled alternation of the marker texts (longest
        first), built once per format instead of on every call of ``lit`` (14% of the time)."""
        by_text = {m.text: name for name, m in self.markers.items()}
        alternatives = "|".join(re.escape(t) for t in sorted(by_text, key=len, reverse=True))
        return by_text, re.compile(alternatives)

    @functools.cached_property
    def _lits(self) -> dict[tuple[str, bool], tuple[Segment, ...]]:
        return {}

    def lit(self, text: str, trained: bool = False) -> list[Segment]:
        """Split template literal text at this format's marker texts into segments. Template
        literals are few and recur in every record: each is split once (segments are
        immutable)."""
        if not text:
            return []
        cache = self._lits
        got = cache.get((text, trained))
        if got is None:
            got = tuple(self._split_markers(text, trained))
            if len(cache) < 4096:
                cache[(text, trained)] = got
        return list(got)

    def _split_markers(self, text: str, trained: bool) -> list[Segment]:
        by_text, pattern = self._marker_pattern
        out: list[Segment] = []
        pos = 0
        for m in pattern.finditer(text):
            if m.start() > pos:
                out.append(Text(text[pos : m.start()], trained))
            out.append(Special(by_text[m.group(0)], trained))
            pos = m.end()
        if pos < len(text):
            out.append(Text(text[pos:], trained))
        return out

    def _no_tools(self, tools: Sequence[dict[str, Any]]) -> None:
        if tools and not self.supports_tools:
            raise FormatError(
                f"format {self.name} has no way to show tool schemas to the model (its chat "
                "template drops them); put the schemas in a system message, or declare a TOML "
                "format with a tool prompt"
            )

    # --- prompt: validator -> normaliser -> role hooks ----------------------------------------
    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        *,
        add_generation_prompt: bool = True,
        thinking: bool = True,
        **options: Any,
    ) -> list[Segment]:
        for key in options:
            if key not in self.prompt_options:
                raise TypeError(
                    f"{type(self).__qualname__}.render_prompt() got an unexpected keyword "
                    f"argument {key!r}"
                )
        self.validate(messages, tools)
        conv = self.normalise(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            thinking=thinking,
            **options,
        )
        out = self.render_head(conv)
        for i, m in enumerate(conv.messages):
            role = m.role
            if role == "user":
                out += self.render_user(conv, i, m)
            elif role == "assistant":
                out += self.render_assistant(conv, i, m)
            elif role == "tool":
                out += self.render_tool(conv, i, m)
            elif role == "system":
                out += self.render_system(conv, i, m)
            else:
                out += self.render_other(conv, i, m)
        out += self.render_tail(conv)
        return out

    def validate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> None:
        """Refuse, before anything is rendered, what this format cannot show."""
        self._no_tools(tools)

    def normalise(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        thinking: bool,
        **options: Any,
    ) -> Conversation:
        """The messages as the role hooks see them (content trimmed where the format trims)."""
        shown = tuple(
            replace(m, content=(m.content or "").strip()) if self.trim_content else m
            for m in messages
        )
        return Conversation(
            shown,
            tuple(tools),
            add_generation_prompt=add_generation_prompt,
            thinking=thinking,
        )

    def render_head(self, conv: Conversation) -> list[Segment]:
        """What comes before the first message (BOS, a system block, the tool prompt)."""
        return []

    def render_system(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        raise NotImplementedError(f"format {self.name} renders no system messages")

    def render_user(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        raise NotImplementedError(f"format {self.name} renders no user messages")

    def render_assistant(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        raise NotImplementedError(f"format {self.name} renders no assistant messages")

    def render_tool(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        raise NotImplementedError(f"format {self.name} renders no tool messages")

    def render_other(self, conv: Conversation, i: int, m: Message) -> list[Segment]:
        """A message of any other role: left out unless the format shows it."""
        return []

    def render_tail(self, conv: Conversation) -> list[Segment]:
        """What comes after the last message: the generation prompt where one is asked for."""
        return self.generation_prompt_segments(conv.thinking) if conv.add_generation_prompt else []

    def generation_prompt_segments(self, thinking: bool) -> list[Segment]:
        gp = self.generation_prompt
        if not thinking and self.generation_prompt_no_think is not None:
            gp = self.generation_prompt_no_think
        return self.lit(gp)

    # --- response grammar -------------------------------------------------------------------
    def answer_thinking(self, messages: Sequence[Message], thinking: bool | None) -> bool | None:
        """The thinking option the answer to ``messages`` is laid out under: ``thinking`` as
        given, except where the template opens no think block before that answer whatever the
        option says (DeepSeek V3.1 after tool results)."""
        return thinking

    @property
    def has_tool_grammar(self) -> bool:
        return type(self).render_tool_calls is not ChatFormat.render_tool_calls

    def render_tool_calls(
        self, calls: Sequence[ToolCall], content: str, tool_text: str = "template"
    ) -> list[Segment]:
        """The tool-call section after ``content``. ``tool_text`` says what the content holds:
        ``template`` (a prompt's history: the template's own separator), ``add_missing`` (an
        answer whose text may have lost its trailing separator: added where it is not there)
        or ``as_is`` (an answer exactly as the model wrote it: nothing added)."""
        raise FormatError(f"format {self.name} has no tool-call grammar")

    #: the model family whose answers a server's parsers treat as one (``records.servers``
    #: keys what a server does to one family's answers only by it); None: no such behaviour
    family: ClassVar[str | None] = None

    @property
    def server_losses(self) -> tuple[ServerLoss, ...]:
        """What server behaviours lose of this format's grammar for good, and the label each
        gives (the family's declaration, data); ``tokens.response`` reads them."""
        return ()

    def server_loss(self, part: LossPart, behaviours: frozenset[str]) -> str | None:
        """The label of the first declared loss on ``part`` that one of ``behaviours`` (what
        the server does to this family's answers) causes, or None."""
        for loss in self.server_losses:
            if loss.part == part and loss.behaviour in behaviours:
                return loss.label
        return None

    def model_ids(
        self, calls: Sequence[ToolCall], history: Sequence[Message], renumbered: bool
    ) -> tuple[tuple[ToolCall, ...], int]:
        """The calls with the ids the model itself wrote, where the model's numbering rule gives
        them back (every id that differs from it where the server ``renumbered`` them, else
        those not in the model's own form); and how many were rebuilt."""
        return tuple(calls), 0

    def tool_call_loss(self, calls: Sequence[ToolCall]) -> str | None:
        """What these calls lost for good whatever the server (``lossy:<reason>``: arguments a
        parser cannot have returned as written), or None; checked before ``server_losses``."""
        return None

    def parse_tool_calls(self, segments: Sequence[Segment]) -> tuple[ToolCall, ...]:
        """Tool calls from an answer's tool-call section, the way a server's tool parser returns
        them (the inverse of ``render_tool_calls``)."""
        return ()

    def render_response(
        self,
        *,
        content: str,
        reasoning: str | None = None,
        tool_calls: Sequence[ToolCall] = (),
        finished: bool = True,
        thinking: bool = True,
        verbatim: bool = False,
        content_as_is: bool | None = None,
        tool_text: str = "add_missing",
    ) -> list[Segment]:
        """Segments of one assistant answer as the model generates it after the generation prompt.
        ``finished`` appends the end-of-turn marker; a truncated (``length``) answer ends bare.
        ``verbatim``: reasoning and content are exactly the text around the think markers (the
        grammar's newlines are in them, so none is added); ``content_as_is`` says it for the
        content alone (a server that strips the content before tool calls)."""
        out: list[Segment] = []
        th = self.think
        # cut by ``length`` inside the reasoning: the model never wrote the close marker, the
        # content or the end of turn (an answer cut exactly after the close marker reads the
        # same in a server's view; it is the rare case, and takes this branch too)
        cut_in_reasoning = not finished and bool(reasoning) and not content and not tool_calls
        if th is not None and (thinking or reasoning):
            # the prompt wrote the open marker and what follows it, or the answer does
            opens_here = not (th.prompt_opens and thinking)
            head: list[Segment] = [Special(th.open)] if opens_here else []
            opened = th.open_suffix if opens_here and not verbatim else ""
            pre = "" if verbatim else th.close_prefix
            as_is = verbatim if content_as_is is None else content_as_is
            post = "" if as_is else th.close_suffix
            if cut_in_reasoning:
                return train(merge_text([*head, Text(opened + (reasoning or ""))]))
            if (
                verbatim
                and as_is
                and th.tools_in_think
                and tool_calls
                and not content
                and reasoning
            ):
                # the tool-call section opened inside the reasoning: no close marker was written
                out += [*head, Text(reasoning)]
                out += self.render_tool_calls(tool_calls, "", tool_text)
                if finished:
                    out.append(Special(self.end_of_turn))
                return train(merge_text(out))
            if reasoning is not None or th.prompt_opens:
                out += [
                    *head,
                    Text(opened + (reasoning or "") + pre),
                    Special(th.close),
                    Text(post),
                ]
        out.append(Text(content))
        if tool_calls:
            out += self.render_tool_calls(tool_calls, content, tool_text)
        if finished:
            out.append(Special(self.end_of_turn))
        return train(merge_text(out))

    # --- binding ------------------------------------------------------------------------------
    def bind(self, tokenizer: Tokenizer, *, strict: bool = True) -> BoundFormat:
        checks = [check_marker(tokenizer, name, spec) for name, spec in self.markers.items()]
        problems = [c for c in checks if not c.ok]
        if strict and problems:
            raise MarkerError("; ".join(f"{c.name}: {c.problem}" for c in problems))
        ids: dict[str, int] = {}
        for c in checks:
            if c.pinned is not None:
                ids[c.name] = c.pinned  # non-strict: use the pin as declared, so its damage shows
            elif c.id is not None and c.kind in ("special", "added"):
                ids[c.name] = c.id
        fmt = self.adapt(tokenizer, ids)
        return BoundFormat(fmt, tokenizer, ids, tuple(checks))

    def adapt(self, tokenizer: Tokenizer, ids: dict[str, int]) -> ChatFormat:
        """Hook for families whose grammar depends on the tokenizer (optional markers, defaults)."""
        return self

    def with_overrides(self, **changes: Any) -> ChatFormat:
        return replace(self, **changes)


F = TypeVar("F", bound=ChatFormat)


def version_of(base: ChatFormat, cls: type[F], **changes: Any) -> F:
    """A version of ``base`` whose hooks are those of ``cls`` (a subclass of the base's class):
    ``dataclasses.replace`` across classes. Everything not in ``changes`` is the base's."""
    kept = {f.name: getattr(base, f.name) for f in fields(base) if f.init}
    return cls(**{**kept, **changes})


def separator(sep: str, content: str, tool_text: str, present: bool) -> str:
    """The separator written between an answer's text and its tool calls: the grammar's
    ``sep`` where the template writes one (``present``), less what the text already ends
    with (``add_missing``), nothing for text exactly as the model wrote it (``as_is``)."""
    if not present or tool_text == "as_is":
        return ""
    if tool_text == "add_missing":
        for k in range(len(sep), 0, -1):
            if content.endswith(sep[:k]):
                return sep[k:]
    return sep


@dataclass(frozen=True)
class BoundFormat:
    """A format whose markers are resolved and verified against one tokenizer."""

    format: ChatFormat
    tokenizer: Tokenizer
    ids: dict[str, int]
    checks: tuple[MarkerCheck, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def end_id(self) -> int:
        return self.ids[self.format.end_of_turn]

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset(
            self.ids[m]
            for m in (self.format.end_of_turn, *self.format.stop_markers)
            if m in self.ids
        )

    def closed(self, ids: Sequence[int], finish_reason: str) -> list[int]:
        """An answer's ids ending with its stop id when the finish reason says the model ended
        its turn (servers leave the stop token out of the ids and tokens they report)."""
        out = list(ids)
        if finish_reason in FINISHED and (not out or out[-1] not in self.stop_ids):
            out.append(self.end_id)
        return out

    def marker_text(self) -> dict[str, str]:
        return {n: m.text for n, m in self.format.markers.items()}

    def render_text(self, segments: Sequence[Segment]) -> str:
        return segments_text(segments, self.marker_text())
