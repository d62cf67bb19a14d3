"""Chat formats: a registry by name, plus formats declared in TOML files."""

from __future__ import annotations

from pathlib import Path

from ..errors import FormatError
from .base import BoundFormat, ChatFormat, Conversation, ThinkGrammar, version_of
from .families import BUILTIN, TemplateFormat
from .inverse import derive_view
from .markers import MarkerCheck, MarkerSpec, describe_id
from .segments import Segment, Special, Text, merge_text

__all__ = [
    "BUILTIN",
    "BoundFormat",
    "ChatFormat",
    "Conversation",
    "MarkerCheck",
    "MarkerSpec",
    "Segment",
    "Special",
    "TemplateFormat",
    "Text",
    "ThinkGrammar",
    "derive_view",
    "describe_id",
    "get_format",
    "merge_text",
    "version_of",
]


def get_format(name: str, relative_to: Path | None = None) -> ChatFormat:
    """A built-in format by name, or a format declared in a ``.toml`` file."""
    if name in BUILTIN:
        return BUILTIN[name]
    path = Path(name)
    if relative_to is not None and not path.is_absolute() and not path.exists():
        path = relative_to / path
    if name.endswith(".toml") or path.exists():
        if not path.exists():
            raise FormatError(f"{name}: format file not found")
        from .declared import load_format_file  # pydantic: 0.1 s of start-up, for TOML only

        return load_format_file(path, get_format)
    raise FormatError(
        f"unknown format {name!r}; choose one of {', '.join(sorted(BUILTIN))}, "
        "or pass a .toml file that declares one"
    )
