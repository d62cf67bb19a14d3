"""An export sealed by its manifest: ``manifest.json`` lists every other file of the folder (the
shards, the preview, each trainer's files) with its size and sha256, written last, before the
folder is swapped in (``shards.publish``). ``verify_export`` checks a folder against its list:
a file missing, changed or not listed means the export is not the one its manifest describes.

A top-level folder of more than ``LISTED_MAX`` files (ModelOpt's one file per sample) is listed
in its own ``SHA256SUMS`` (``sha256sum``'s format: ``sha256sum -c SHA256SUMS`` checks it from
inside the folder), written a line at a time, and the manifest lists that file: the manifest, and
every reader of it, stays the same size however many samples the run has.

``restage`` starts the next export from the published one (its files hard-linked, or copied
across file systems) so that trainer files added later are swapped in with the export, never
written into the published folder."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..files import atomic_path, write_json
from ..records.export import SUMS_FILE, FileEntry
from ..tokenizers.base import file_sha256
from .shards import staging_folder
from .write import MANIFEST_FILE, read_export_manifest

__all__ = ["LISTED_MAX", "SUMS_FILE", "ExportCheck", "restage", "seal", "verify_export"]

#: a top-level folder of more files than this is listed in its own SUMS_FILE, not the manifest
LISTED_MAX = 1000


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` but its manifest, as sorted relative POSIX paths. Walked
    with ``os.walk``, which holds a folder's names as strings: ``Path.rglob`` holds a folder's
    whole listing as ``os.DirEntry`` objects and yields a ``Path`` per file, ~780 bytes a file
    at its peak under tracemalloc (90 MB for the 109k files of ModelOpt's layout at 83k)."""
    out: list[str] = []
    for top, _, names in os.walk(folder):
        rel = os.path.relpath(top, folder)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        out.extend(prefix + n for n in names if os.path.isfile(os.path.join(top, n)))
    out.sort()
    if MANIFEST_FILE in out:
        out.remove(MANIFEST_FILE)
    return out


def _owner(owner: Mapping[str, str | None], rel: str) -> str | None:
    """The trainer that wrote ``rel``: its own entry, or its folder's SUMS_FILE entry."""
    if rel in owner:
        return owner[rel]
    top, _, rest = rel.partition("/")
    return owner.get(f"{top}/{SUMS_FILE}") if rest else None


def _summed(folder: Path, rels: Sequence[str]) -> set[str]:
    """The top-level folders of ``rels`` holding more than LISTED_MAX files, each given its
    SUMS_FILE (written a line at a time)."""
    count: dict[str, int] = {}
    for rel in rels:
        top, _, rest = rel.partition("/")
        if rest:
            count[top] = count.get(top, 0) + 1
    big = {top for top, n in count.items() if n > LISTED_MAX}
    for top in big:
        prefix = f"{top}/"
        with atomic_path(folder / top / SUMS_FILE) as tmp, tmp.open("w", encoding="utf-8") as f:
            for rel in rels:
                if rel.startswith(prefix) and rel != f"{top}/{SUMS_FILE}":
                    f.write(f"{file_sha256(folder / rel)}  {rel[len(prefix) :]}\n")
    return big


def _sums(folder: Path, sums: str) -> list[tuple[str, str]]:
    """The ``(path in the export, sha256)`` lines of the SUMS_FILE at ``sums``; raises ValueError
    on a line not in that format."""
    top = sums.rsplit("/", 1)[0]
    out = []
    with (folder / sums).open(encoding="utf-8") as f:
        for line in f:
            digest, sep, rel = line.rstrip("\n").partition("  ")
            if not sep or len(digest) != 64 or not rel:
                raise ValueError(f"{sums}: not a '<sha256>  <path>' line: {line[:80]!r}")
            out.append((f"{top}/{rel}", digest))
    return out


def _in_sums(folder: Path, listed: Mapping[str, object]) -> set[str]:
    """Every path the SUMS_FILEs among ``listed`` list (those that can be read)."""
    out: set[str] = set()
    for rel in listed:
        if rel.endswith(f"/{SUMS_FILE}"):
            with contextlib.suppress(OSError, ValueError):
                out.update(p for p, _ in _sums(folder, rel))
    return out


def seal(folder: Path, trainers: Mapping[str, Sequence[Path]] = {}) -> None:
    """List every file of ``folder`` in its manifest with size and sha256, each trainer's
    (``trainers``: the paths each ``export --as`` NAME wrote) under its name; a folder of more
    than LISTED_MAX files through its SUMS_FILE."""
    em = read_export_manifest(folder)
    owner: dict[str, str | None] = {f.path: f.trainer for f in em.files}
    dirs: dict[str, str] = {}  # a folder a trainer wrote: every file under it is its
    for name, paths in trainers.items():
        for p in paths:
            rel = p.relative_to(folder).as_posix()
            if p.is_dir():
                dirs[rel + "/"] = name
            else:
                owner[rel] = name

    def who(rel: str) -> str | None:
        return next((n for d, n in dirs.items() if rel.startswith(d)), None) or _owner(owner, rel)

    rels = _files(folder)
    big = _summed(folder, rels)
    # every file outside a summed folder, and each summed folder's SUMS_FILE in its place
    listed = sorted(
        {r for r in rels if r.partition("/")[0] not in big} | {f"{t}/{SUMS_FILE}" for t in big}
    )
    files = tuple(
        FileEntry(rel, (folder / rel).stat().st_size, file_sha256(folder / rel), who(rel))
        for rel in listed
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
    owner: dict[str, str | None] = {f.path: f.trainer for f in read_export_manifest(real).files}
    listed = set(owner) | _in_sums(real, owner)
    made: set[Path] = set()
    for rel in [*_files(real), MANIFEST_FILE]:
        if rel in listed and _owner(owner, rel) == trainer:
            continue
        dst = staged / rel
        if dst.parent not in made:
            dst.parent.mkdir(parents=True, exist_ok=True)
            made.add(dst.parent)
        try:
            if rel not in listed:
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
    """Check every file ``folder``'s manifest lists (size, then sha256), every file its
    SUMS_FILEs list (sha256), and that together they list every file there. A manifest that
    lists no files (written before exports did) is a problem: nothing says the folder is whole."""
    em = read_export_manifest(folder)
    trainers = tuple(sorted({f.trainer for f in em.files if f.trainer}))
    if not em.files:
        problem = "the manifest lists no files (an older export); export again"
        return ExportCheck(folder, em.created_at, 0, trainers, [problem])
    problems: list[str] = []
    listed = {f.path for f in em.files}
    sums = []
    for f in em.files:
        path = folder / f.path
        if not path.is_file():
            problems.append(f"{f.path}: missing")
        elif path.stat().st_size != f.bytes:
            problems.append(f"{f.path}: {path.stat().st_size} bytes, listed {f.bytes}")
        elif file_sha256(path) != f.sha256:
            problems.append(f"{f.path}: its sha256 is not the one listed")
        elif f.path.endswith(f"/{SUMS_FILE}"):
            sums.append(f.path)
    checked = len(em.files)
    for s in sums:
        try:
            lines = _sums(folder, s)
        except ValueError as e:
            problems.append(str(e))
            continue
        for rel, digest in lines:
            listed.add(rel)
            checked += 1
            if not (folder / rel).is_file():
                problems.append(f"{rel}: missing")
            elif file_sha256(folder / rel) != digest:
                problems.append(f"{rel}: its sha256 is not the one {s} lists")
    extra = [rel for rel in _files(folder) if rel not in listed]
    if extra:
        problems.append(f"not listed: {', '.join(extra[:5])}" + (" ..." * (len(extra) > 5)))
    return ExportCheck(folder, em.created_at, checked, trainers, problems)
