"""Helpers shared by the built-in formats."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..records import Message
from .segments import Segment, Special, Text


def _text(m: Message) -> str:
    return m.content or ""


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
