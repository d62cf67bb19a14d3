"""The command layer: parse arguments, call the library, print, map errors to exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from ..errors import DraftdataError, InputError
from ..files import not_a_file, write_json
from ..lines import capped_lines
from ..nesting import TooDeep, loads_json
from ..progress import Ticker as _Ticker
from ..shown import redact, shown
from ..version import __version__

app = typer.Typer(
    name="draftdata",
    help="Token-exact training data for speculative-decoding drafters.\n\n"
    "Start with `draftdata init` (a commented manifest), `draftdata plan MANIFEST` (what a run "
    "will ask for and cost, without sending a request) and `draftdata run MANIFEST`.",
    no_args_is_help=False,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)
out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, soft_wrap=True)


def say(console: Console, message: str, style: str | None = None) -> None:
    """Print ``message`` as it is: no markup is interpreted in text that names user input, no
    secret is shown and no control byte reaches the terminal raw (``draftdata.shown``)."""
    console.print(Text(shown(message), style=style or ""), soft_wrap=True)


def example(*lines: str) -> str:
    """A help epilog with example invocations."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {ln}" for ln in lines)  # \b: keep lines


TokenizerOpt = Annotated[
    str,
    typer.Option(
        "--tokenizer",
        "-t",
        help="HF folder, tokenizer.json, tiktoken file, GGUF, or pkg:MODULE/path inside a package",
    ),
]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="the target model: folder, GGUF or pkg:MODULE, or the base URL of the vLLM or "
        "SGLang server that serves it (its own log-probabilities)",
    ),
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device", help="where the model runs: cpu, cuda, cuda:N, or auto (split over the GPUs)"
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


class UsageProblem(DraftdataError):
    """The command line itself is wrong (exit 2)."""


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    if ctx.invoked_subcommand is None:
        names = ", ".join(sorted(c for c in ctx.command.list_commands(ctx)))  # type: ignore[attr-defined]
        raise UsageProblem(
            f"no command given; run `draftdata COMMAND ...` with one of: {names} "
            "(`draftdata --help` explains each)"
        )


def open_jsonl(path: Path) -> IO[bytes]:
    """``path`` opened for ``text_lines``."""
    kind = not_a_file(path, pipes=True)
    if kind is not None:
        raise InputError(f"{path}: not a regular file ({kind}); give a JSONL file")
    try:
        return path.open("rb")
    except OSError as e:
        raise InputError(f"{path}: cannot open ({e.strerror}); check the path") from e


def text_lines(f: IO[bytes], counter: dict[str, int]) -> Iterator[str]:
    """The lines of ``f``, each capped in bytes while read (``lines.capped_lines``: a longer
    one is counted by its number and comes as an empty line), as text whose bytes that are not
    UTF-8 come through as lone surrogates (``surrogateescape``): such a line is then skipped
    and counted by ``jsonl_records``, not a decode error that ends the read."""
    for raw in capped_lines(f, counter):
        yield raw.decode("utf-8", errors="surrogateescape")


def read_jsonl(path: Path, counter: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; malformed or over-long lines are skipped and counted, never
    fatal. A file with no line of UTF-8 text (a binary file) is an InputError."""
    counter = {} if counter is None else counter
    with open_jsonl(path) as f:
        yield from jsonl_records(text_lines(f, counter), counter, path)


def _is_utf8(line: str) -> bool:
    """False for a line read with ``surrogateescape`` that held bytes that are not UTF-8."""
    if line.isascii():
        return True
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def jsonl_records(
    lines: Iterable[str], counter: dict[str, int] | None = None, path: Path | None = None
) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``lines``: with a ``counter``, a malformed line (or one that is not
    UTF-8) is skipped and counted by reason; without one it is an InputError naming ``path``
    and the line. With a ``path`` (the whole file), a file with lines that are not UTF-8 and no
    record is an InputError: it is not a JSONL file (a binary file, most likely)."""
    records = binary_lines = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not _is_utf8(line):
            binary_lines += 1
            if counter is not None:
                counter["invalid_utf8"] = counter.get("invalid_utf8", 0) + 1
                continue
            raise InputError(f"{path}:{lineno}: not UTF-8 text; a JSONL file is UTF-8")
        try:
            rec = loads_json(line)
        except ValueError as e:
            reason = "too_deep" if isinstance(e, TooDeep) else "malformed_json"
            if counter is not None:
                counter[reason] = counter.get(reason, 0) + 1
                continue
            raise InputError(f"{path}:{lineno}: not valid JSON ({e})") from None
        if not isinstance(rec, dict):
            if counter is not None:
                counter["not_an_object"] = counter.get("not_an_object", 0) + 1
                continue
            raise InputError(f"{path}:{lineno}: expected a JSON object per line")
        records += 1
        yield rec
    if path is not None and binary_lines and not records:
        raise InputError(
            f"{path}: not a JSONL file ({binary_lines} lines are not UTF-8 text and none is a "
            "record: a binary file?); pass a JSONL file, one JSON object per line"
        )


def command_line() -> list[str]:
    """The command as the user typed it (recorded in the run's ledger for the report, and in
    the run folder's lock), with any secret in it redacted (a URL's password, a key)."""
    return ["draftdata", *(redact(a) for a in sys.argv[1:])]


class Ticker(_Ticker):
    """The progress line of ``draftdata.progress`` on the CLI's stderr console."""

    def __init__(
        self, what: str, total: int | None, every: float = 15.0, unit: str = "records"
    ) -> None:
        super().__init__(what, total, every, err, unit)


def emit_json(doc: Any, dest: Any) -> bool:
    """Write ``doc`` as JSON to the path ``dest`` (atomically: a reader never sees half a
    report, and a failed write leaves the old one) or, for ``-``, to stdout; True when it went
    to stdout (the caller prints nothing else). Every command's ``--json`` goes through here."""
    if str(dest) == "-":
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return True
    write_json(Path(dest), doc)
    return False
