"""JSON and TOML as a user hands them over, with their nesting bounded.

``json.loads`` and ``tomllib`` recurse once per level: a 100,000-deep ``[[[...]]]`` raises
``RecursionError``, which no caller catching ``ValueError`` expects, and a document a few
hundred levels deep parses but makes every later pass over it (``json.dumps`` into the ledger,
a template's ``tojson``) recurse as deep. Every reader of a user's file parses through
``loads_json`` / ``loads_toml``: nesting past ``MAX_DEPTH`` is a ``TooDeep``, a ``ValueError``,
so a reader that skips and counts a malformed line skips and counts it too."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["MAX_DEPTH", "TooDeep", "depth_over", "loads_json", "loads_toml"]

#: the deepest nesting of arrays and objects read: real tool schemas and messages nest a
#: few dozen levels at most
MAX_DEPTH = 128


#: a dotted key (``a.b.c... = 1``, ``[a.b.c...]``) of more than MAX_DEPTH parts: tomllib takes
#: memory quadratic in its parts (8,000 parts: 260 MB), so it is refused before parsing
_DOTTED = re.compile(r"(?<![\w-])(?:[\w-]++\s*+\.\s*+){" + str(MAX_DEPTH) + "}")


class TooDeep(ValueError):
    """A document nested deeper than ``MAX_DEPTH`` levels."""

    def __init__(self, what: str = "JSON") -> None:
        super().__init__(f"{what} nested deeper than {MAX_DEPTH} levels")


def depth_over(doc: Any, limit: int = MAX_DEPTH) -> bool:
    """True when ``doc`` nests lists, tuples or dicts deeper than ``limit`` levels (walked
    without recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, (list, tuple)):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in node if isinstance(child, (dict, list, tuple)))
    return False


def _brackets(text: str | bytes) -> int:
    """An upper bound of the nesting depth of JSON text: its opening brackets."""
    if isinstance(text, str):
        return text.count("[") + text.count("{")
    return text.count(b"[") + text.count(b"{")


def loads_json(text: str | bytes) -> Any:
    """``json.loads(text)``; nesting deeper than ``MAX_DEPTH`` raises ``TooDeep``."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise TooDeep("JSON") from None
    if _brackets(text) > MAX_DEPTH and depth_over(doc):
        raise TooDeep("JSON")
    return doc


def loads_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``; nesting deeper than ``MAX_DEPTH`` raises ``TooDeep`` (which
    is not a ``TOMLDecodeError``: catch ``ValueError`` for both)."""
    if _DOTTED.search(text):
        raise TooDeep("TOML")
    try:
        doc: dict[str, Any] = tomllib.loads(text)
    except RecursionError:
        raise TooDeep("TOML") from None
    if depth_over(doc):  # dotted keys (a.b.c = 1) nest with no bracket; a manifest is small
        raise TooDeep("TOML")
    return doc
