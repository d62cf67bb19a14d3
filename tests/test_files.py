"""The one atomic writer (draftdata.files): a reader sees the old file or the new one, the old
folder or the new one; a crash half way leaves the old one whole, and the next swap cleans up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from draftdata.files import (
    atomic_path,
    replacing_dir,
    stage_dir,
    swap_dir,
    write_json,
    write_text,
)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out" / "doc.json"
    write_json(target, {"a": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("{half", encoding="utf-8")
        raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in target.parent.iterdir()) == ["doc.json"]


def test_a_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "page.html"
    write_text(target, "old")
    write_text(target, "néw")
    assert target.read_text(encoding="utf-8") == "néw"
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


# --- folders swapped into place (replacing_dir, stage_dir, swap_dir) -----------------------------
#: a process that stages the next ``sys.argv[1]`` beside it, writes half of it, prints the
#: staging folder and then, by ``sys.argv[2]``: "kill" (SIGKILL itself: no cleanup runs), "wait"
#: (hold it until stdin closes), "swap-kill" (SIGKILL itself between the swap's two renames)
WRITER = """
import os, signal, sys
from pathlib import Path
from draftdata.files import stage_dir, swap_dir
target, how = Path(sys.argv[1]), sys.argv[2]
staged = stage_dir(target)
(staged / "doc.txt").write_text("half")
print(staged, flush=True)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "wait":
    sys.stdin.read()
if how == "swap-kill":
    real = os.rename
    def rename(src, dst):
        if Path(src) == staged:  # the old folder is aside, the new one not yet in place
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)
    os.rename = rename
    swap_dir(staged, target)
"""


def writer(target, how: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def folder_of(target) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(target.iterdir())}


def test_an_error_half_way_leaves_the_old_folder_and_the_next_swap_succeeds(tmp_path):
    target = tmp_path / "out"
    with replacing_dir(target) as staged:
        (staged / "doc.txt").write_text("old")
    with pytest.raises(RuntimeError), replacing_dir(target) as staged:
        (staged / "doc.txt").write_text("half")
        raise RuntimeError("killed mid-write")
    assert folder_of(target) == {"doc.txt": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the staging folder removed
    with replacing_dir(target) as staged:
        (staged / "doc.txt").write_text("new")
    assert folder_of(target) == {"doc.txt": "new"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the old folder removed


def test_a_killed_writers_leftover_is_cleaned_up_and_a_live_writers_is_not(tmp_path):
    target = tmp_path / "out"
    with replacing_dir(target) as staged:
        (staged / "doc.txt").write_text("old")
    live = writer(target, "wait")
    assert live.stdout is not None and live.stdin is not None
    held = Path(live.stdout.readline().strip())
    try:
        killed = writer(target, "kill")
        dead = Path(killed.communicate()[0].strip())
        assert killed.returncode == -signal.SIGKILL
        assert folder_of(dead) == {"doc.txt": "half"}  # what a kill -9 leaves beside it
        assert folder_of(target) == {"doc.txt": "old"}  # and the old folder, whole
        with replacing_dir(target) as staged:
            assert not dead.exists() and held.exists()  # only the dead process's is removed
            (staged / "doc.txt").write_text("new")
        assert folder_of(target) == {"doc.txt": "new"}
        assert folder_of(held) == {"doc.txt": "half"}  # still being written
    finally:
        live.stdin.close()
        live.wait()
    with replacing_dir(target) as staged:  # its process is gone: a leftover now
        (staged / "doc.txt").write_text("newer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert folder_of(target) == {"doc.txt": "newer"}


def test_a_kill_between_the_two_renames_gets_the_old_folder_back(tmp_path):
    target = tmp_path / "out"
    with replacing_dir(target) as staged:
        (staged / "doc.txt").write_text("old")
    killed = writer(target, "swap-kill")
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL
    assert not target.exists()  # the one moment a real folder is missing
    (aside,) = tmp_path.glob(".out-old-*")
    assert folder_of(aside) == {"doc.txt": "old"}
    staged = stage_dir(target)  # the next run: the old folder back first, the rest removed
    assert folder_of(target) == {"doc.txt": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", staged.name])
    (staged / "doc.txt").write_text("new")
    swap_dir(staged, target)
    assert folder_of(target) == {"doc.txt": "new"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_linked_target_switches_in_one_rename_and_an_open_reader_reads_on(tmp_path):
    link = tmp_path / "export"
    link.mkdir()  # a real folder, written before the target was a link
    (link / "doc.txt").write_text("legacy")
    first = stage_dir(link)
    (first / "doc.txt").write_text("old")
    swap_dir(first, link, link=True)
    assert link.is_symlink() and folder_of(link) == {"doc.txt": "old"}
    second = stage_dir(link)
    (second / "doc.txt").write_text("new" * 10_000)
    with (link / "doc.txt").open() as reader:
        swap_dir(second, link, link=True)
        assert reader.read() == "old"  # the old folder is gone, its open file is not
    assert os.readlink(link) == second.name
    assert folder_of(link) == {"doc.txt": "new" * 10_000}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["export", second.name])


def test_keep_replaces_the_other_entries_and_refuse_replacing_keeps_the_target(tmp_path):
    target = tmp_path / "out"
    (target / "hidden_states").mkdir(parents=True)
    (target / "hidden_states" / "hs_0.safetensors").write_text("captured")
    (target / "state.json").write_text("old")
    (target / "gone.arrow").write_text("old")
    with replacing_dir(target, keep=("hidden_states",)) as staged:
        (staged / "state.json").write_text("new")
        (staged / "data.arrow").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["data.arrow", "hidden_states", "state.json"]
    assert (target / "state.json").read_text() == "new"
    assert (target / "hidden_states" / "hs_0.safetensors").read_text() == "captured"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with pytest.raises(OSError), replacing_dir(target, replace=False) as staged:
        (staged / "state.json").write_text("other")
    assert (target / "state.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
