"""The export of a stream of samples: Parquet shards, ``preview.json`` and ``manifest.json`` in one
folder, from any ``Iterable[Sample]`` (read once, one sample at a time) and the manifest's
run-level facts. ``export_run`` feeds it a run's ledger; nothing here needs a run, its lock or
its ledger. ``read_export_manifest`` is the one reader of the file it writes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..files import write_json
from ..records import Sample
from ..records.arrow import shard_row
from ..records.export import ExportManifest
from .preview import PER_DATASET, write_preview
from .shards import SHARD_BYTES, ShardWriter, now_iso

if TYPE_CHECKING:
    from ..tokenizers.base import Tokenizer

MANIFEST_FILE = "manifest.json"

__all__ = ["MANIFEST_FILE", "read_export_manifest", "write_export"]


def write_export(
    samples: Iterable[Sample],
    folder: Path,
    head: ExportManifest,
    *,
    metadata: Callable[[Sample], Mapping[str, Any]] | None = None,
    tokenizer: Tokenizer | None = None,
    shard_bytes: int | None = None,
) -> ExportManifest:
    """``samples`` (each with its key) as ``folder/shard-*.parquet``, and ``folder/manifest.json``:
    ``head`` (the run, its datasets' settings and drops, validation, gate, cost) with the
    figures counted from the samples, the shards and the time. ``metadata`` gives a sample's
    prompt metadata for its row (none: ``{}``); with ``tokenizer``, ``folder/preview.json``
    shows the first samples of each dataset token by token. Returns the manifest written."""
    writer = ShardWriter(folder, max_bytes=shard_bytes or SHARD_BYTES)
    first: dict[str, list[Sample]] = {name: [] for name in head.datasets}

    def written() -> Iterator[Sample]:
        for s in samples:
            writer.add(shard_row(s, metadata(s) if metadata is not None else {}))
            kept = first.setdefault(s.dataset, [])
            if len(kept) < PER_DATASET:
                kept.append(s)
            yield s

    try:
        counted = head.counted(written())
    except BaseException:
        writer.abort()
        raise
    done = replace(counted, shards=tuple(writer.close()), created_at=now_iso())
    if tokenizer is not None:
        write_preview(first, tokenizer, folder)
    write_json(folder / MANIFEST_FILE, done.to_json())
    return done


def read_export_manifest(folder: Path) -> ExportManifest:
    """``folder/manifest.json``; an InputError that names the fix where it is missing or is
    not an export's manifest."""
    path = folder / MANIFEST_FILE
    run = folder.parent
    if not path.is_file():
        raise InputError(
            f"{path} not found; run `draftdata run MANIFEST` (or `draftdata export {run}`) first"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not readable JSON ({e}); re-run `draftdata export {run}`") from e
    try:
        return ExportManifest.from_json(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(
            f"{path}: not an export manifest ({type(e).__name__}: {e}); re-run "
            f"`draftdata export {run}`"
        ) from e
