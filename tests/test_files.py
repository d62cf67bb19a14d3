"""The one atomic writer (draftdata.files): a reader sees the old file or the new one."""

from __future__ import annotations

import json

import pytest

from draftdata.files import atomic_path, write_json, write_text


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
