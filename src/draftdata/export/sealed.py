"""An export sealed by its manifest: ``manifest.json`` lists every other file of the folder (the
shards, the preview, each trainer's files) with its size and sha256, written last, before the
folder is swapped in (``shards.publish``). ``verify_export`` checks a folder against its list:
a file missing, changed or not listed means the export is not the one its manifest describes.

``restage`` starts the next export from the published one (its files hard-linked, or copied
across file systems) so that trainer files added later are swapped in with the export, never
written into the published folder."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..files import write_json
from ..records.export import FileEntry
from ..tokenizers.base import file_sha256
from .shards import staging_folder
from .write import MANIFEST_FILE, read_export_manifest

__all__ = ["ExportCheck", "restage", "seal", "verify_export"]


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` but its manifest, as sorted relative POSIX paths."""
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST_FILE
    )


def seal(folder: Path, trainers: Mapping[str, Sequence[Path]] = {}) -> None:
    """List every file of ``folder`` in its manifest with size and sha256, each trainer's
    (``trainers``: the paths each ``export --as`` NAME wrote) under its name."""
    em = read_export_manifest(folder)
    owner = {f.path: f.trainer for f in em.files}
    for name, paths in trainers.items():
        for p in paths:
            found = [p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()]
            for q in found:
                owner[q.relative_to(folder).as_posix()] = name
    files = tuple(
        FileEntry(rel, (folder / rel).stat().st_size, file_sha256(folder / rel), owner.get(rel))
        for rel in _files(folder)
    )
    write_json(folder / MANIFEST_FILE, replace(em, files=files).to_json())


def restage(published: Path, trainer: str) -> Path:
    """A new staging folder holding the files of the ``published`` export but ``trainer``'s,
    for that trainer's files to be written again before the swap. A file the manifest lists
    is hard-linked (no writer opens a listed file of another trainer, or a shard, for
    writing); one it does not list (an older export's) is copied, since a writer may rewrite
    it in place, and a hard link would change the published file with it."""
    staged = staging_folder(published.parent)
    real = published.resolve()
    owner = {f.path: f.trainer for f in read_export_manifest(real).files}
    for rel in [*_files(real), MANIFEST_FILE]:
        if rel in owner and owner[rel] == trainer:
            continue
        dst = staged / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            if rel not in owner:
                raise OSError("not listed: copied")
            os.link(real / rel, dst)
        except OSError:
            shutil.copy2(real / rel, dst)
    return staged


@dataclass(frozen=True)
class ExportCheck:
    """What ``verify_export`` found: the files checked and what does not match."""

    folder: Path
    created_at: str
    checked: int = 0
    trainers: tuple[str, ...] = ()
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_export(folder: Path) -> ExportCheck:
    """Check every file ``folder``'s manifest lists (size, then sha256) and that it lists every
    file there. A manifest that lists no files (written before exports did) is a problem:
    nothing says the folder is whole."""
    em = read_export_manifest(folder)
    trainers = tuple(sorted({f.trainer for f in em.files if f.trainer}))
    check = ExportCheck(folder, em.created_at, len(em.files), trainers)
    if not em.files:
        check.problems.append("the manifest lists no files (an older export); export again")
        return check
    listed = {f.path for f in em.files}
    for f in em.files:
        path = folder / f.path
        if not path.is_file():
            check.problems.append(f"{f.path}: missing")
        elif path.stat().st_size != f.bytes:
            check.problems.append(f"{f.path}: {path.stat().st_size} bytes, listed {f.bytes}")
        elif file_sha256(path) != f.sha256:
            check.problems.append(f"{f.path}: its sha256 is not the one listed")
    extra = [rel for rel in _files(folder) if rel not in listed]
    if extra:
        check.problems.append(f"not listed: {', '.join(extra[:5])}" + (" ..." * (len(extra) > 5)))
    return check
