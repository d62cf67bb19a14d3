"""The lines of a file a user hands over, each capped in bytes while it is read.

``for line in f`` and ``f.readline()`` hold a whole line however long it is: one 2 GB line
took 8.8 GB before a reader could refuse it. ``capped_lines`` reads at most ``MAX_LINE_BYTES``
of a line; a longer one is read past in pieces, counted by its line number
(``line_too_long:N``) and given as an empty line in its place, so that line numbers hold and
a reader that skips blank lines skips it. Every JSONL reader (prompt sources, ``reconstruct``,
``validate``, ``audit --data``, the replay server) reads through it."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import IO, Any

from .errors import InputError
from .nesting import loads_json

__all__ = ["MAX_LINE_BYTES", "capped_lines", "count_too_long", "strict_jsonl"]

#: the longest line read, in bytes: a prompt of ``max_prompt_chars`` (1,000,000 characters by
#: default) written as JSON with every character escaped (``\\uXXXX``) fits 5 times over
MAX_LINE_BYTES = 32 << 20
#: over-long lines named by their number in a counter; the ones after are counted together
NAMED = 20
_SKIP = 1 << 20


def count_too_long(counter: MutableMapping[str, int] | None, lineno: int) -> None:
    """Count the over-long line ``lineno``: by its number for the first ``NAMED``, then as
    ``line_too_long:more``."""
    if counter is None:
        return
    named = sum(1 for k in counter if k.startswith("line_too_long:") and k[14:].isdigit())
    key = f"line_too_long:{lineno}" if named < NAMED else "line_too_long:more"
    counter[key] = counter.get(key, 0) + 1


def capped_lines(
    f: IO[bytes],
    counter: MutableMapping[str, int] | None = None,
    *,
    first: bytes = b"",
    lineno: int = 0,
    cap: int = MAX_LINE_BYTES,
) -> Iterator[bytes]:
    """The lines of the binary file ``f`` (newline kept), each at most ``cap`` bytes besides
    it; a longer line is read past without being held, counted in ``counter`` and given as
    ``b""``. ``first``: bytes already read from ``f`` (a few, at the start of line
    ``lineno + 1``)."""
    pending = first
    while True:
        if not pending:
            line = f.readline(cap + 1)
        elif (nl := pending.find(b"\n")) >= 0:
            line, pending = pending[: nl + 1], pending[nl + 1 :]
        else:
            line, pending = pending + f.readline(max(cap + 1 - len(pending), 1)), b""
        if not line:
            return
        lineno += 1
        if len(line) <= cap or (len(line) == cap + 1 and line.endswith(b"\n")):
            yield line
            continue
        del line
        while True:  # the rest of the line, in pieces that are dropped as they come
            rest = f.readline(_SKIP)
            if not rest or rest.endswith(b"\n"):
                break
        count_too_long(counter, lineno)
        yield b""


def strict_jsonl(path: Path, what: str) -> Iterator[Any]:
    """The JSON values of the JSONL file ``path``, a line at a time (capped), for files that
    hold nothing but records (samples draftdata wrote): a line past the cap, not JSON or
    nested too deep is an InputError naming the line and ``what`` the file should hold."""
    too_long: dict[str, int] = {}
    with path.open("rb") as f:
        for n, raw in enumerate(capped_lines(f, too_long), 1):
            if too_long:
                raise InputError(
                    f"{path}:{n}: a line over {MAX_LINE_BYTES >> 20} MiB; {what} holds no such line"
                )
            if not raw.strip():
                continue
            try:
                yield loads_json(raw)
            except ValueError as e:
                raise InputError(f"{path}:{n}: not JSON ({e}); {what}") from None
