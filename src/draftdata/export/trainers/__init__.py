"""Trainer-specific exports, by name: the one table a new trainer format is added to. The CLI's
``export --as`` choices come from it.

Each writer takes the runner of an exported run and writes one file beside the shards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import specforge, speculators

if TYPE_CHECKING:
    from ...generate.runner import Runner


@dataclass(frozen=True)
class Exporter:
    name: str
    write: Callable[[Runner, Path], Path]
    summary: str


EXPORTERS: dict[str, Exporter] = {
    e.name: e
    for e in (
        Exporter(
            "speculators",
            speculators.write_jsonl,
            "JSONL with our input_ids and loss_mask (0/1), loaded by speculators and SpecForge",
        ),
        Exporter(
            "specforge",
            specforge.write_conversations,
            "SpecForge conversations JSONL (reasoning as reasoning_content, tool calls); "
            "SpecForge re-tokenizes it",
        ),
    )
}


def export_as(runner: Runner, name: str) -> Path:
    folder = runner.m.output_dir / "export"
    folder.mkdir(parents=True, exist_ok=True)
    return EXPORTERS[name].write(runner, folder)


__all__ = ["EXPORTERS", "Exporter", "export_as"]
