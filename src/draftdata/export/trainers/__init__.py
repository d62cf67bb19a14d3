"""Trainer-specific exports, by name: the one table a new trainer format is added to. The CLI's
``export --as`` choices come from it.

Each writer takes the runner of an exported run and writes its files beside the shards. ``lossy``
marks an export whose trainer re-tokenizes text: the ids it trains on are not ours."""

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
    write: Callable[[Runner, Path], Path | tuple[Path, ...]]
    summary: str
    #: why the trainer will not train on our ids (None: it trains on them exactly)
    lossy: str | None = None


EXPORTERS: dict[str, Exporter] = {
    e.name: e
    for e in (
        Exporter(
            "speculators",
            speculators.write_both,
            "our input_ids and loss_mask as JSONL (speculators prepare-data) and as a "
            "save_to_disk dataset (speculators-dataset/, its trainer and offline generation)",
        ),
        Exporter(
            "specforge",
            specforge.write_pretokenized,
            "our input_ids and loss_mask as the pre-tokenized JSONL of SpecForge's "
            "data.prompts_path",
        ),
        Exporter(
            "specforge-conversations",
            specforge.write_conversations,
            "LOSSY: conversations that SpecForge re-tokenizes with the stock tokenizer",
            lossy=specforge.LOSSY,
        ),
    )
}


def export_as(runner: Runner, name: str) -> tuple[Path, ...]:
    folder = runner.m.output_dir / "export"
    folder.mkdir(parents=True, exist_ok=True)
    out = EXPORTERS[name].write(runner, folder)
    return out if isinstance(out, tuple) else (out,)


__all__ = ["EXPORTERS", "Exporter", "export_as"]
