"""Helpers shared by the reader modules (``native`` and ``tabular``): the ``Skip`` signal a
reader raises for a malformed record, turn-text checks, and tool-schema normalisation to the
OpenAI tool format. Kept apart so that neither reader module imports the other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..nesting import loads_json
from ..records import Message


class Skip(Exception):
    """A record is malformed; ``reason`` is the counter key it is skipped under."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _text(value: Any) -> str:
    """A non-blank string, verbatim; anything else skips the record."""
    if not isinstance(value, str):
        raise Skip("bad_turn" if value is not None else "empty_turn")
    if not value.strip():
        raise Skip("empty_turn")
    return value


def function_tool(obj: Any) -> dict[str, Any]:
    """OpenAI tool format from a bare function schema or an already wrapped tool."""
    if not isinstance(obj, Mapping):
        raise Skip("bad_tools")
    fn = obj.get("function") if obj.get("type") == "function" else obj
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise Skip("bad_tools")
    return {"type": "function", "function": dict(fn)}


def tools_of(raw: Any) -> tuple[dict[str, Any], ...]:
    """Tools from a list of schemas, one schema, or their JSON text (LLaMA-Factory, xLAM)."""
    if raw is None or raw == "" or raw == []:
        return ()
    if isinstance(raw, str):
        try:
            raw = loads_json(raw)
        except ValueError:
            raise Skip("bad_tools") from None
    if isinstance(raw, Mapping):
        raw = [raw]
    if not isinstance(raw, list):
        raise Skip("bad_tools")
    return tuple(function_tool(t) for t in raw)


def _with_user(msgs: Sequence[Message]) -> tuple[Message, ...]:
    if not any(m.role == "user" for m in msgs):
        raise Skip("no_user_turn")
    return tuple(msgs)
