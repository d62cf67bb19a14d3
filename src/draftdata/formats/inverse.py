"""The inverse grammar: ids -> the view an OpenAI-compatible server returns for them.

Special tokens are skipped, reasoning is split off at the think markers, a native tool-call
section is parsed into tool calls the way a server's tool parser does, and the end-of-turn
marker is dropped. Validation uses it where a ground-truth record carries no server view, and
engines that return ids use it to show the answer as text."""

from __future__ import annotations

from collections.abc import Sequence

from ..records import FINISHED, ApiView, ToolCall
from .base import BoundFormat
from .segments import Segment, Special, Text


def derive_view(bound: BoundFormat, output_ids: Sequence[int], finish_reason: str) -> ApiView:
    """The answer an OpenAI-compatible server would return for these ids: special tokens
    skipped, reasoning split off at the think markers, the end-of-turn marker dropped."""
    ids = list(output_ids)
    if finish_reason in FINISHED and ids and ids[-1] in bound.stop_ids:
        ids = ids[:-1]
    fmt, tok = bound.format, bound.tokenizer
    reasoning = None
    th = fmt.think
    if th is not None and th.close in bound.ids and bound.ids[th.close] in ids:
        cut = ids.index(bound.ids[th.close])
        head = ids[:cut]
        if head and th.open in bound.ids and head[0] == bound.ids[th.open]:
            head = head[1:]
        reasoning = tok.decode(head)
        ids = ids[cut + 1 :]
    elif th is not None and th.prompt_opens and finish_reason == "length":
        reasoning, ids = tok.decode(ids), []
    calls: tuple[ToolCall, ...] = ()
    section = bound.ids.get(fmt.tool_section) if fmt.tool_section else None
    if section is not None and section in ids:
        cut = ids.index(section)
        calls = fmt.parse_tool_calls(_segments(bound, ids[cut:]))
        if calls:  # a server's tool parser takes the section out of the content
            ids = ids[:cut]
    control = tok.control_ids
    # verbatim, as vLLM's parsers keep it (the newlines before a tool call included)
    content = tok.decode([i for i in ids if i not in control])
    return ApiView(
        content=content or (None if calls else ""),
        finish_reason=finish_reason,
        reasoning=reasoning,
        tool_calls=calls,
    )


def _segments(bound: BoundFormat, ids: Sequence[int]) -> list[Segment]:
    """Ids as the format's segments: marker ids by name, runs of other ids decoded to text."""
    names = {v: k for k, v in bound.ids.items()}
    out: list[Segment] = []
    run: list[int] = []
    for i in ids:
        if i in names:
            if run:
                out.append(Text(bound.tokenizer.decode(run)))
                run = []
            out.append(Special(names[i]))
        else:
            run.append(i)
    if run:
        out.append(Text(bound.tokenizer.decode(run)))
    return out
