"""Segments: the unit every format renders to (a target turns them into ids + mask:
``tokens.target.Target.encode``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Text:
    """Ordinary text: always encoded as text, never matched against control tokens."""

    text: str
    trained: bool = False


@dataclass(frozen=True)
class Special:
    """A control token, named by the format's marker name and resolved to a verified id."""

    marker: str
    trained: bool = False


Segment = Text | Special


def train(segments: Iterable[Segment], trained: bool = True) -> list[Segment]:
    return [
        Text(s.text, trained) if isinstance(s, Text) else Special(s.marker, trained)
        for s in segments
    ]


def merge_text(segments: Iterable[Segment]) -> list[Segment]:
    """Join adjacent text with the same ``trained`` flag (BPE merges across them); drop empties."""
    out: list[Segment] = []
    for s in segments:
        if isinstance(s, Text):
            if not s.text:
                continue
            last = out[-1] if out else None
            if isinstance(last, Text) and last.trained == s.trained:
                out[-1] = Text(last.text + s.text, s.trained)
                continue
        out.append(s)
    return out


#: learned split preferences: a text piece and its canonical ids -> the ids to use (same bytes)
TextIds = Callable[[str, list[int]], list[int]]


def segments_text(segments: Iterable[Segment], marker_texts: dict[str, str]) -> str:
    """The string a chat template would print for these segments (for diffs and debugging)."""
    return "".join(s.text if isinstance(s, Text) else marker_texts[s.marker] for s in segments)
