"""Every path a user can hand over (issue 37): a read-only folder, a file where a folder belongs
and a folder where a file belongs are one line naming the path and the fix (exit 2), never a
raw errno or a traceback; a read-only run still reads. Each case failed before the change it
guards."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import GROUNDTRUTH
from servers import manifest, replay_server
from shared import SMOLLM2, UNIQUE, one_line_exit_2, run, write_prompts

GT_LINES = GROUNDTRUTH.read_text().splitlines(keepends=True)


#: run inside a user and mount namespace of its own: ``$2`` (an empty folder) becomes a read-only
#: bind mount of ``$1`` (exit 97 where it cannot be made), the Python ``$4`` checks with the probe
#: ``$3`` that a file written there fails with EROFS even for the namespace's root (exit 96 where
#: it does not), then the arguments from ``$4`` on run
IN_READ_ONLY = """
src=$1 ro=$2 probe=$3
shift 3
mount --bind "$src" "$ro" || exit 97
mount -o remount,ro,bind "$ro" || exit 97
"$1" -c "$probe" "$ro" || exit 96
exec "$@"
"""

#: the probe: a new file in ``argv[1]`` must be refused as a read-only filesystem
EROFS_PROBE = """
import errno, os, sys
path = os.path.join(sys.argv[1], ".draftdata-read-only-probe")
try:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
except OSError as e:
    if e.errno != errno.EROFS:
        sys.exit(f"a write to the read-only mount failed with {e!r}, not EROFS")
else:
    os.remove(path)
    sys.exit("a write to the read-only mount went through")
"""


@dataclasses.dataclass(frozen=True)
class ReadOnly:
    """``folder`` as a container mounts a volume ``:ro`` (root ignores file modes, so a chmod
    would not do), seen at ``path``: the bind mount exists only in the namespace ``run`` makes,
    outside it ``path`` is an empty folder."""

    folder: Path
    path: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``draftdata args`` as shared.run runs it, with ``path`` the read-only ``folder``.
        The mount is made in a user and mount namespace of its own (``unshare``, util-linux),
        so no root is needed; a machine that cannot make one fails, naming why."""
        unshare = shutil.which("unshare")
        assert unshare, "the read-only tests need util-linux's `unshare` to bind-mount a folder"
        namespace = [unshare, "--user", "--map-root-user", "--mount"]
        script = [IN_READ_ONLY, "sh", str(self.folder), str(self.path), EROFS_PROBE]
        r = subprocess.run(
            [*namespace, "sh", "-c", *script, sys.executable, "-m", "draftdata", *args],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        why = "this kernel or container refuses user namespaces, or bind mounts in them"
        assert r.returncode != 97 and not r.stderr.startswith("unshare:"), (
            f"could not bind-mount {self.folder} read-only in a namespace of its own ({why}): "
            f"{r.stderr}"
        )
        assert r.returncode != 96, f"{self.path} is not read-only in the namespace: {r.stderr}"
        return r


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[ReadOnly]:
    """``folder`` read-only at an empty folder made beside it, removed afterwards."""
    ro = Path(tempfile.mkdtemp(prefix=folder.name + "-ro", dir=folder.parent))
    try:
        yield ReadOnly(folder, ro)
    finally:
        ro.rmdir()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A small run against the replay server, exported: its manifest and run folder."""
    tmp = tmp_path_factory.mktemp("run")
    src = write_prompts(tmp / "p.jsonl", UNIQUE[:12])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp, url, src, limit=12, turns="first")
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
    r = run("export", str(tmp / "run"))
    assert r.returncode == 0, r.stderr
    return m, tmp / "run"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# --- a read-only output ------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_reconstruct_into_a_read_only_folder_is_one_line(suffix, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(GT_LINES[:3]))
    out = tmp_path / "out"
    out.mkdir()
    with read_only(out) as ro:
        o = f"{ro.path}/o.{suffix}"
        line = one_line_exit_2(
            ro.run("reconstruct", str(src), "-t", SMOLLM2, "-f", "chatml", "-o", o)
        )
        assert str(ro.path) in line and "read-only" in line
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("cmd", ["generate", "run", "export"])
def test_a_writer_on_a_read_only_run_is_one_line(cmd, finished_run, tmp_path):
    m, run_dir = finished_run
    before = snapshot(run_dir)
    with read_only(run_dir) as ro:
        m2 = tmp_path / "manifest.toml"
        m2.write_text(m.read_text().replace(f'output = "{run_dir}"', f'output = "{ro.path}"'))
        args = [str(ro.path)] if cmd == "export" else [str(m2), "--quiet"]
        line = one_line_exit_2(ro.run(cmd, *args))
        assert str(ro.path) in line and "read-only" in line and "Errno" not in line
    assert snapshot(run_dir) == before


def test_a_new_run_under_a_read_only_folder_is_one_line(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    parent = tmp_path / "parent"
    parent.mkdir()
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    with read_only(parent) as ro:
        output = f'output = "{tmp_path / "run"}"'
        m.write_text(m.read_text().replace(output, f'output = "{ro.path}/r"'))
        line = one_line_exit_2(ro.run("generate", str(m), "--quiet"))
        assert str(ro.path) in line and "read-only" in line


def test_status_reads_a_read_only_run(finished_run, tmp_path):
    """A finished run has no -shm file; SQLite cannot make one on a read-only mount, so the
    ledger is read as immutable."""
    m, run_dir = finished_run
    assert not (run_dir / "ledger.sqlite-shm").exists()
    with read_only(run_dir) as ro:
        m2 = tmp_path / "manifest.toml"
        m2.write_text(m.read_text().replace(f'output = "{run_dir}"', f'output = "{ro.path}"'))
        r = ro.run("status", str(m2))
        assert r.returncode == 0, r.stderr
        assert "not a readable" not in r.stdout + r.stderr
        assert "12" in r.stdout


# --- a file where a folder belongs, a folder where a file belongs -------------------------------
@pytest.mark.parametrize("cmd", ["validate", "learn", "reconstruct"])
def test_a_folder_where_a_file_belongs_is_one_line(cmd, tmp_path):
    src = tmp_path / "gt.jsonl"
    src.write_text("".join(GT_LINES[:40]))
    folder = tmp_path / "out.json"
    (folder / "keep").mkdir(parents=True)
    flag = {"validate": "--json", "learn": "-o", "reconstruct": "-o"}[cmd]
    args = [cmd, str(src), "-t", SMOLLM2, "-f", "chatml", flag, str(folder)]
    if cmd == "learn":
        args += ["--min-support", "1"]
    line = one_line_exit_2(run(*args))
    assert str(folder) in line and "folder where a file belongs" in line
    assert (folder / "keep").is_dir()


@pytest.mark.parametrize("cmd", ["reconstruct", "generate"])
def test_a_file_where_a_folder_belongs_is_one_line(cmd, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("kept\n")
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    if cmd == "reconstruct":
        gt = tmp_path / "gt.jsonl"
        gt.write_text("".join(GT_LINES[:2]))
        args = [cmd, str(gt), "-t", SMOLLM2, "-f", "chatml", "-o", f"{blocker}/out.jsonl"]
    else:
        m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
        m.write_text(m.read_text().replace(f'"{tmp_path / "run"}"', f'"{blocker}/run"'))
        args = [cmd, str(m), "--quiet"]
    line = one_line_exit_2(run(*args))
    assert str(blocker) in line and "a file where a folder belongs" in line
    assert blocker.read_text() == "kept\n"


def test_a_run_output_that_is_a_file_is_one_line(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    (tmp_path / "run").write_text("kept\n")
    line = one_line_exit_2(run("generate", str(m), "--quiet"))
    assert str(tmp_path / "run") in line
    assert (tmp_path / "run").read_text() == "kept\n"


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_a_run_output_that_is_a_broken_symlink_says_so(link, tmp_path):
    """Issue 53 item 13: on 42e677c both said "is a file where a folder belongs"."""
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    out = tmp_path / "run"
    if link == "dangling":
        out.symlink_to(tmp_path / "gone")
    else:
        out.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(out)
    line = one_line_exit_2(run("generate", str(m), "--quiet"))
    assert str(out) in line and "symlink" in line, line
    assert "a file where a folder belongs" not in line, line
    if link == "dangling":
        assert str(tmp_path / "gone") in line, line
    assert out.is_symlink()  # left as it was


def test_a_save_to_disk_state_naming_a_file_outside_its_folder_is_refused(tmp_path):
    """Issue 53 item 13: a ``state.json`` naming ``../../../../etc/passwd`` was followed."""
    from draftdata.errors import InputError
    from draftdata.sources.tabular import data_files

    folder = tmp_path / "split"
    folder.mkdir()
    for name in ("../../../../etc/passwd", "/etc/passwd", "sub/../../x.arrow"):
        state = {"_data_files": [{"filename": name}]}
        (folder / "state.json").write_text(json.dumps(state))
        with pytest.raises(InputError, match="outside"):
            data_files(folder)


# --- an output folder that is not the run's own ---------------------------------------------------
def test_the_filesystem_root_as_output_is_refused(tmp_path):
    from draftdata.config import ManifestError, load_manifest

    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    m.write_text(m.read_text().replace(f'output = "{tmp_path / "run"}"', 'output = "/"'))
    with pytest.raises(ManifestError, match="root"):
        load_manifest(m)  # plan, generate and run all load it first; nothing is written to /
    line = one_line_exit_2(run("plan", str(m)))
    assert "run.output" in line and "root" in line and "force_output" in line


def test_a_folder_of_other_files_as_output_is_refused_unless_forced(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    out = tmp_path / "run"
    out.mkdir()
    (out / "thesis.tex").write_text("kept\n")
    line = one_line_exit_2(run("generate", str(m), "--quiet"))
    assert str(out) in line and "not a draftdata run" in line and "force_output" in line
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    m.write_text(m.read_text().replace('name = "test"', 'name = "test"\nforce_output = true'))
    r = run("generate", str(m), "--quiet")
    assert "not a draftdata run" not in r.stderr and (out / "ledger.sqlite").is_file()
    assert (out / "thesis.tex").read_text() == "kept\n"


def test_an_empty_folder_or_a_run_folder_is_taken_as_output(tmp_path):
    from draftdata.config import load_manifest

    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    (tmp_path / "run").mkdir()
    load_manifest(m)
    (tmp_path / "run" / "ledger.sqlite").write_bytes(b"")
    (tmp_path / "run" / "report.html").write_text("x")
    load_manifest(m)


# --- a source that never ends ---------------------------------------------------------------------
def _refused(*args: str) -> str:
    try:  # before the fix it read /dev/zero until memory ran out
        r = subprocess.run(
            [sys.executable, "-m", "draftdata", *args], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"draftdata {' '.join(args)} did not stop") from None
    return one_line_exit_2(r)


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_manifest_source_that_is_not_a_file_is_refused(kind, tmp_path):
    if kind == "device":
        src = Path("/dev/zero")
    else:
        src = tmp_path / "pipe.jsonl"
        os.mkfifo(src)
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    for cmd in ("plan", "generate"):
        line = _refused(cmd, str(m))
        assert str(src) in line and "not a regular file" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cmd", ["reconstruct", "validate"])
def test_an_input_that_is_a_device_is_refused(cmd, tmp_path):
    args = [cmd, "/dev/zero", "-t", SMOLLM2, "-f", "chatml"]
    if cmd == "reconstruct":
        args += ["-o", str(tmp_path / "out.jsonl")]
    line = _refused(*args)
    assert "/dev/zero" in line and "not a regular file" in line
