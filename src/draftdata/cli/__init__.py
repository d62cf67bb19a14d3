"""The command layer: parse arguments, call the library, print, map errors to exit codes.

One module per command group; ``app`` holds what they share. Importing the groups registers
their commands."""

from __future__ import annotations

import sys

import click

from ..errors import DraftdataError
from . import audit, run, tokens  # noqa: F401  (registers the commands)
from .app import app, err


def main() -> None:
    try:
        rv = app(standalone_mode=False)
    except DraftdataError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.exceptions.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    if isinstance(rv, int):
        sys.exit(rv)


__all__ = ["app", "main"]
