"""SIGTERM during `export --as ...` (issue 37): the export and its trainers' files are swapped in
as one, and its manifest lists every file with size and sha256, so a kill at any point leaves
the previous export or the new one, whole, and ``verify_export`` says which. Each case failed
before the change it guards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GROUNDTRUTH, require
from servers import manifest, replay_server
from shared import UNIQUE, run, write_prompts

AS = ["--as", "speculators", "--as", "specforge"]
#: runs ``draftdata export`` and sends itself SIGTERM at its K-th file event (a file opened
#: for writing; a folder made, a rename, a link: before it and after it): a real signal, at a
#: point that is the same from run to run, with no sleep
KILL_AT = """
import builtins, io, os, runpy, signal, sys
k, n = int(sys.argv[1]), [0]
def tick():
    n[0] += 1
    if n[0] == k:
        os.kill(os.getpid(), signal.SIGTERM)
real_open = io.open
def opened(file, mode="r", *a, **kw):
    if any(c in mode for c in "wax+"):
        tick()
    return real_open(file, mode, *a, **kw)
builtins.open = io.open = opened
for name in ("replace", "rename", "symlink", "link", "mkdir"):
    def wrapped(*a, _real=getattr(os, name), **kw):
        tick()
        done = _real(*a, **kw)
        tick()
        return done
    setattr(os, name, wrapped)
sys.argv = ["draftdata", "export", *sys.argv[2:]]
try:
    runpy.run_module("draftdata", run_name="__main__", alter_sys=True)
finally:
    print("events", n[0], file=sys.stderr)
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small run, exported with both trainers' files."""
    tmp = tmp_path_factory.mktemp("run")
    src = write_prompts(tmp / "p.jsonl", UNIQUE[:12])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp, url, src, limit=12, turns="first")
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
    r = run("export", str(tmp / "run"), *AS)
    assert r.returncode == 0, r.stderr
    return tmp / "run"


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_the_manifest_lists_every_file_and_verify_checks_them(exported, tmp_path):
    from draftdata.export.sealed import verify_export

    folder = exported / "export"
    doc = json.loads((folder / "manifest.json").read_text())
    listed = {f["path"]: f for f in doc.get("files", [])}
    assert set(listed) == set(files_of(folder)) - {"manifest.json"}
    by = {f["trainer"] for f in listed.values()}
    assert {"speculators", "specforge"} <= by and None in by
    check = verify_export(folder)
    assert check.ok and check.trainers == ("specforge", "speculators"), check.problems
    # a copy that is changed, or holds a file not listed, is not the export its manifest says
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder.resolve(), copy)
    shard = next(p for p in listed if p.startswith("shard-"))
    data = bytearray((copy / shard).read_bytes())
    data[100] ^= 1
    (copy / shard).write_bytes(bytes(data))
    (copy / ".speculators.jsonl.123.tmp").write_text("half")
    problems = verify_export(copy).problems
    assert any(shard in p and "sha256" in p for p in problems), problems
    assert any("not listed" in p and ".speculators.jsonl.123.tmp" in p for p in problems)


def test_sigterm_at_ten_points_of_an_export_leaves_one_whole(exported):
    from draftdata.export.sealed import verify_export

    def export_killed_at(k: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", KILL_AT, str(k), str(exported), *AS],
            capture_output=True,
            text=True,
            timeout=600,
        )

    whole = export_killed_at(0)  # not killed: how many events an export has
    assert whole.returncode == 0, whole.stderr
    events = int(whole.stderr.split("events")[-1].split()[0])
    assert events >= 10
    points = sorted({1 + i * (events - 1) // 9 for i in range(10)})
    seen = {"previous": 0, "new": 0}
    for k in points:
        before = files_of(exported / "export")
        r = export_killed_at(k)
        assert r.returncode == -15, (k, r.returncode, r.stderr[-500:])  # killed by SIGTERM
        check = verify_export(exported / "export")
        assert check.ok, (k, check.problems)
        assert check.trainers == ("specforge", "speculators"), k
        after = files_of(exported / "export")
        seen["previous" if after == before else "new"] += 1
    assert seen["previous"] and seen["new"], seen  # kills fell before and after the swap


def test_export_verify_says_whole_or_not(exported, tmp_path):
    """`draftdata export RUN --verify` writes nothing: exit 0 and "whole" on the export as
    written, exit 1 and the mismatch on a copy with one shard byte flipped."""
    import shutil

    before = files_of(exported / "export")
    ok = run("export", str(exported), "--verify")
    assert ok.returncode == 0, ok.stderr
    assert "whole, the export of" in ok.stdout and "trainers: specforge, speculators" in ok.stdout
    assert files_of(exported / "export") == before  # nothing written
    copy = tmp_path / "run"
    shutil.copytree(exported, copy)  # the export symlink's folder copied as a folder
    shard = next((copy / "export").glob("shard-*.parquet"))
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    bad = run("export", str(copy), "--verify", "--json")
    assert bad.returncode == 1
    doc = json.loads(bad.stdout)
    assert not doc["ok"] and any(shard.name in p and "sha256" in p for p in doc["problems"])


def test_export_reads_a_run_beside_its_writer_and_leaves_its_record(exported):
    """`export` only reads the run (issue 39): it runs while a writer holds the folder (it took
    the folder's lock and was refused, "in use by"), and the command the report shows as the
    one that made the run stays that command (export wrote its own argv over it)."""
    from draftdata.store.ledger import Ledger
    from draftdata.store.lock import RunLock
    from draftdata.store.meta import COMMAND_LINE

    def made_by() -> list[str]:
        led = Ledger(exported / "ledger.sqlite")
        try:
            return led.meta.get(COMMAND_LINE) or []
        finally:
            led.close()

    before = made_by()
    assert before[:2] == ["draftdata", "generate"]  # the fixture exported once already
    lock = RunLock(exported).acquire("a writer in this test")
    try:
        r = run("export", str(exported), *AS)
    finally:
        lock.release()
    assert r.returncode == 0, r.stderr
    assert made_by() == before


#: ``draftdata export`` with the sealed manifest's per-folder threshold lowered to 3 files
SMALL_LISTS = """
import runpy, sys
import draftdata.export.sealed as sealed
sealed.LISTED_MAX = 3
sys.argv = ["draftdata", "export", *sys.argv[1:]]
runpy.run_module("draftdata", run_name="__main__", alter_sys=True)
"""


def test_a_folder_of_many_files_is_listed_in_its_own_sha256sums(tmp_path, monkeypatch):
    """ModelOpt's layout writes a file per sample: listed one by one, 109k of them made the
    manifest (and every reader of it: the next layout's export, the report) grow with the run.
    A folder past LISTED_MAX files is listed in its own SHA256SUMS, which coreutils' sha256sum
    checks, and verify_export checks every file through it."""
    require("torch")  # the dev extra's: a missing one fails, never skips
    from draftdata.export.sealed import verify_export

    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:12])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=12, turns="first")
        assert run("generate", str(m), "--quiet").returncode == 0
    run_dir = tmp_path / "run"

    def export(*args: str) -> None:
        r = subprocess.run(
            [sys.executable, "-c", SMALL_LISTS, str(run_dir), *args], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr

    export("--as", "modelopt")
    folder = (run_dir / "export").resolve()
    ids = sorted(p.name for p in (folder / "modelopt").glob("*.ids.pth"))
    assert len(ids) == 12
    doc = json.loads((folder / "manifest.json").read_text())
    listed = {f["path"]: f["trainer"] for f in doc["files"]}
    assert listed["modelopt/SHA256SUMS"] == "modelopt"
    assert not [p for p in listed if p.endswith(".ids.pth")]
    sums = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"],
        cwd=folder / "modelopt",
        capture_output=True,
        text=True,
    )
    assert sums.returncode == 0, sums.stdout + sums.stderr
    assert sums.stdout.count(": OK") == len(list((folder / "modelopt").iterdir())) - 1
    check = verify_export(folder)
    assert check.ok and check.checked == len(files_of(folder)) - 1, check.problems

    # another layout added later (``export_as``, as `hidden-states` does): the listed folder is
    # linked into the new export, not copied
    import draftdata.export.sealed as sealed
    from draftdata.export.run_export import export_as
    from draftdata.session import Run
    from draftdata.store.runs import manifest_of_run

    monkeypatch.setattr(sealed, "LISTED_MAX", 3)
    inode = (folder / "modelopt" / ids[0]).stat().st_ino
    m = manifest_of_run(run_dir)
    m.run.output = str(run_dir.resolve())
    with Run.open(m, write=False) as s:
        export_as(s.ledger, m, s.target.bound, "specforge")
    again = (run_dir / "export").resolve()
    assert again != folder and (again / "modelopt" / ids[0]).stat().st_ino == inode
    doc = json.loads((again / "manifest.json").read_text())
    by = {f["path"]: f["trainer"] for f in doc["files"]}
    assert by["modelopt/SHA256SUMS"] == "modelopt" and "specforge" in by.values()
    assert verify_export(again).ok

    # a changed file in the folder, or one it does not list, is found
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(again, copy)
    data = bytearray((copy / "modelopt" / ids[3]).read_bytes())
    data[-1] ^= 1
    (copy / "modelopt" / ids[3]).write_bytes(bytes(data))
    (copy / "modelopt" / "stray.pt").write_bytes(b"x")
    problems = verify_export(copy).problems
    assert f"modelopt/{ids[3]}: its sha256 is not the one modelopt/SHA256SUMS lists" in problems
    assert any("not listed" in p and "modelopt/stray.pt" in p for p in problems), problems


def test_listing_an_export_holds_its_names_not_a_path_per_file(tmp_path):
    """Every layout at once grew 451 -> 553 MB from 10k to 83k prompts: the listing behind
    seal, restage and verify_export walked with ``Path.rglob``, which holds a folder's whole
    listing as ``os.DirEntry`` objects and a ``Path`` per file (~780 bytes a file at its peak,
    under tracemalloc; 90 MB for ModelOpt's 109k files). The listing holds its names only."""
    import tracemalloc

    from draftdata.export.sealed import _files

    n = 3000
    (tmp_path / "modelopt").mkdir()
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "shard-00000.parquet").write_text("")
    for i in range(n):
        (tmp_path / "modelopt" / f"{i:08d}.ids.pth").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "manifest.json").write_text("{}")  # only the top one is the manifest
    tracemalloc.start()
    try:
        got = _files(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    want = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert got == [r for r in want if r != "manifest.json"]
    assert peak / n < 400, f"{peak / n:.0f} bytes a file at the listing's peak"
