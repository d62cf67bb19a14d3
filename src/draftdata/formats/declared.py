"""Chat formats declared in TOML, without code.

```toml
name = "my-chatml"          # required
version = "2"               # required: bump it when anything below changes
base = "chatml"             # optional: a built-in format (or another TOML file) to start from
description = "..."
end_of_turn = "im_end"      # a marker name
stop_markers = []

[markers]                   # merged over the base's markers
im_start = "<|im_start|>"
im_end = { text = "<|im_end|>", id = 2 }   # an id pin is checked when the format is bound

[messages]                  # only for template formats (no base, or base chatml / llama3)
default = "<|im_start|>{role}\\n{content}<|im_end|>\\n"
generation_prompt = "<|im_start|>assistant\\n"
default_system = "auto"     # or a string, or omit
trim_content = false
bos = "bos"                 # a marker name written first

[think]                     # optional response grammar for reasoning
open = "think_open"
close = "think_close"
open_suffix = "\\n"
close_prefix = "\\n"
close_suffix = "\\n\\n"
prompt_opens = false
```
A new version overrides only what changed: everything not given is taken from ``base``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import FormatError
from ..nesting import TooDeep, loads_toml
from .base import ChatFormat, ThinkGrammar
from .families import TemplateFormat
from .markers import MarkerSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: how a ``base`` is found: (name, the folder of the file naming it) -> the format; the package
#: passes its ``get_format``, so this module never imports the package that imports it
Lookup = Callable[[str, Path], ChatFormat]


class _Marker(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    id: int | None = None
    optional: bool = False


class _Messages(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: str | None = None
    system: str | None = None
    user: str | None = None
    assistant: str | None = None
    tool: str | None = None
    generation_prompt: str | None = None
    generation_prompt_no_think: str | None = None
    default_system: str | None = None
    trim_content: bool | None = None
    bos: str | None = None


class _Think(BaseModel):
    model_config = ConfigDict(extra="forbid")
    open: str
    close: str
    open_suffix: str = ""
    close_prefix: str = ""
    close_suffix: str = ""
    prompt_opens: bool = False
    #: the model may open its tool-call section inside the reasoning (Qwen3.5's XML calls)
    tools_in_think: bool = False


class _FormatDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    version: str
    base: str | None = None
    description: str | None = None
    end_of_turn: str | None = None
    stop_markers: list[str] | None = None
    markers: dict[str, str | _Marker] = {}
    messages: _Messages | None = None
    think: _Think | None = None


def load_format_file(path: Path, lookup: Lookup) -> ChatFormat:
    """The format ``path`` declares; its ``base`` (a built-in name or another TOML file) is
    found through ``lookup``."""
    try:
        raw = loads_toml(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise FormatError(f"{path}: cannot read ({e})") from e
    except UnicodeDecodeError as e:
        raise FormatError(
            f"{path}: not a format file (byte {e.start} is not UTF-8 text); pass a chat format "
            "declared in TOML (docs/tokenizers-and-formats.md, Chat formats) or a built-in name "
            "(`draftdata formats`)"
        ) from None
    except TooDeep as e:
        raise FormatError(f"{path}: {e}; a format file nests a few tables at most") from None
    except tomllib.TOMLDecodeError as e:
        raise FormatError(f"{path}: invalid TOML ({e}); fix the syntax at that line") from e
    try:
        doc = _FormatDoc.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise FormatError(
            f"{path}: {loc}: {err['msg']}; see docs/tokenizers-and-formats.md, Chat formats, "
            "for the keys"
        ) from e
    return build_format(doc, path, lookup)


def build_format(doc: _FormatDoc, path: Path, lookup: Lookup) -> ChatFormat:
    if doc.base is not None:
        base = lookup(doc.base, path.parent)
    else:
        base = TemplateFormat(
            name=doc.name, version=doc.version, description="", markers={}, end_of_turn=""
        )
    markers = dict(base.markers)
    for name, m in doc.markers.items():
        markers[name] = (
            MarkerSpec(m) if isinstance(m, str) else MarkerSpec(m.text, m.id, m.optional)
        )
    changes: dict[str, Any] = {
        "name": doc.name,
        "version": doc.version,
        "description": doc.description
        or f"declared in {path.name}" + (f" (based on {base.name})" if doc.base else ""),
        "markers": markers,
    }
    if doc.end_of_turn is not None:
        changes["end_of_turn"] = doc.end_of_turn
    if doc.stop_markers is not None:
        changes["stop_markers"] = tuple(doc.stop_markers)
    if doc.think is not None:
        changes["think"] = ThinkGrammar(**doc.think.model_dump())
    if doc.messages is not None:
        if not isinstance(base, TemplateFormat):
            raise FormatError(
                f"{path}: [messages] only applies to template formats; base "
                f"{base.name!r} renders in code — drop [messages] or the base"
            )
        msg = dict(base.message)
        for role in ("default", "system", "user", "assistant", "tool"):
            val = getattr(doc.messages, role)
            if val is not None:
                msg[role] = val
        changes["message"] = msg
        for key in (
            "generation_prompt",
            "generation_prompt_no_think",
            "default_system",
            "trim_content",
            "bos",
        ):
            val = getattr(doc.messages, key)
            if val is not None:
                changes[key] = val
    fmt = base.with_overrides(**changes)
    _check_names(fmt, path)
    return fmt


def _check_names(fmt: ChatFormat, path: Path) -> None:
    if not fmt.end_of_turn:
        raise FormatError(f"{path}: end_of_turn is required (the marker name that ends a turn)")
    names = [fmt.end_of_turn, *fmt.stop_markers]
    if fmt.think:
        names += [fmt.think.open, fmt.think.close]
    if isinstance(fmt, TemplateFormat) and fmt.bos:
        names.append(fmt.bos)
    for n in names:
        if n not in fmt.markers:
            raise FormatError(
                f'{path}: {n!r} is used but not declared under [markers]; add {n} = "<its text>"'
            )
