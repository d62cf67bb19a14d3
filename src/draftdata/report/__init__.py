"""The run report: one self-contained HTML page (inline CSS and SVG, no network) and a terminal
summary. ``data`` reads the run (shards are streamed; lengths kept as value counts, so a report
over millions of samples holds no rows; the sample viewer's tokens come from the exporter's
``export/preview.json``, the command line and manifest from the ledger), ``alerts`` finds what
to warn about, ``html``/``page``/``viewer``/``svg`` draw the page, ``text`` the summary."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..files import write_text
from .data import collect
from .text import summary


def build_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the HTML report of a run (``RUN/report.html`` by default) and return its path."""
    from .html import render_html

    run_dir = Path(run_dir)
    page = render_html(collect(run_dir))
    target = Path(out) if out is not None else run_dir / "report.html"
    try:
        write_text(target, page)
    except OSError as e:
        raise InputError(f"{target}: cannot write the report ({e.strerror}); check the path") from e
    return target


__all__ = ["build_report", "collect", "summary"]
