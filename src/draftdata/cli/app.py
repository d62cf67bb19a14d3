"""The command layer: parse arguments, call the library, print, map errors to exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from .. import __version__
from ..errors import InputError

app = typer.Typer(
    name="draftdata",
    help="Token-exact training data for speculative-decoding drafters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, soft_wrap=True)

TokenizerOpt = Annotated[
    str,
    typer.Option(
        "--tokenizer",
        "-t",
        help="HF folder, tokenizer.json, tiktoken file, GGUF, or pkg:MODULE/path inside a package",
    ),
]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format", "-f", help="built-in format name (see `draftdata formats`) or a format .toml"
    ),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"draftdata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    pass


def read_jsonl(path: Path, counter: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; malformed lines are skipped and counted, never fatal."""
    try:
        f = path.open(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot open ({e.strerror}); check the path") from e
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if counter is not None:
                    counter["malformed_json"] = counter.get("malformed_json", 0) + 1
                    continue
                raise InputError(f"{path}:{lineno}: not valid JSON") from None
            if not isinstance(rec, dict):
                if counter is not None:
                    counter["not_an_object"] = counter.get("not_an_object", 0) + 1
                    continue
                raise InputError(f"{path}:{lineno}: expected a JSON object per line")
            yield rec


def command_line() -> list[str]:
    """The command as the user typed it (recorded in the run's ledger for the report)."""
    return ["draftdata", *sys.argv[1:]]
