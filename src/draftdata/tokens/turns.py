"""Every assistant turn of a conversation trained in one sequence.

The sequence is the conversation as the format renders it up to its last answer, laid out as
the model wrote that answer. Each earlier answer is trained where the format shows it in the
history exactly as the model wrote it: the turn's own prompt (the conversation before it, with
the generation prompt) must be where the sequence starts, and the answer's response grammar must
follow it unit for unit (text character by character, markers by name). The trained spans are
set on the segments; nothing is encoded per prefix. A format that rewrites history (Qwen3 drops
earlier reasoning and its generation prompt opens an empty think block that the history does
not show) cannot have its turns joined: that record is refused with ``history_not_verbatim``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from ..errors import ReconstructError
from ..formats import Segment, Special, Text
from ..records import ApiView, Message

if TYPE_CHECKING:
    from .encoding import TargetEncoding


class _Flat:
    """Segments as one string to compare with ``startswith``: text as it is, each marker as a
    sentinel character (one no text of the conversation holds) and a character naming it."""

    def __init__(self, sentinel: str) -> None:
        self.sentinel = sentinel
        self.names: dict[str, str] = {}

    def marker(self, name: str) -> str:
        code = self.names.setdefault(name, chr(0xE000 + len(self.names)))
        return self.sentinel + code

    def __call__(self, segs: Sequence[Segment]) -> str:
        return "".join(s.text if isinstance(s, Text) else self.marker(s.marker) for s in segs)


def _sentinel(texts: Sequence[str]) -> str:
    for code in [0, 1, *range(0xFDD0, 0xFDF0)]:  # NUL, SOH, then Unicode noncharacters
        c = chr(code)
        if all(c not in t for t in texts):
            return c
    raise ReconstructError("the conversation holds every sentinel character", "unjoinable")


def _trained(segs: Sequence[Segment], flat: _Flat, spans: list[tuple[int, int]]) -> list[Segment]:
    """``segs`` split at the ``spans`` (offsets in the flat string), trained inside them."""
    out: list[Segment] = []
    pos = 0
    for s in segs:
        if isinstance(s, Special):
            inside = any(a <= pos < b for a, b in spans)
            out.append(Special(s.marker, inside))
            pos += 2
            continue
        end = pos + len(s.text)
        cuts = sorted({pos, end, *(x for ab in spans for x in ab if pos < x < end)})
        for a, b in pairwise(cuts):
            inside = any(x <= a < y for x, y in spans)
            out.append(Text(s.text[a - pos : b - pos], inside))
        pos = end
    return out


def joined_turns(
    target: TargetEncoding,
    messages: Sequence[Message],
    view: ApiView,
    tools: Sequence[dict[str, Any]],
) -> tuple[list[Segment], list[str]]:
    """The segments of ``messages`` + the answer ``view`` with every assistant turn trained, and
    the warnings of the last answer's layout."""
    from .response import answer_segments

    fmt = target.format
    opts = target.prompt_opts
    prompt = fmt.render_prompt(messages, tools, **opts)
    last, warnings = answer_segments(target, messages, view)
    full_segs = [*prompt, *last]
    flat = _Flat(_sentinel([s.text for s in full_segs if isinstance(s, Text)]))
    full = flat(full_segs)
    spans = [(len(flat(prompt)), len(full))]
    for k, m in enumerate(messages):
        if m.role != "assistant":
            continue
        head = flat(fmt.render_prompt(messages[:k], tools, **opts))
        answer = ApiView(m.content, "stop", m.reasoning, m.tool_calls)
        said = flat(answer_segments(target, messages[:k], answer)[0])
        if not (full.startswith(head) and full.startswith(said, len(head))):
            raise ReconstructError(
                f"format {fmt.name} does not show assistant turn {k} in the history as the "
                "model wrote it (the generation prompt or the answer is rendered differently "
                "there); train its turns one sample each",
                "history_not_verbatim",
            )
        spans.append((len(head), len(head) + len(said)))
    return _trained(full_segs, flat, spans), warnings
