"""No export replaced by another manifest (issue 53, item 7). On 42e677c a second manifest with
another dataset, whose output was a symlink to run A's folder, added its prompts to A's ledger
and replaced A's export (120 rows, then 30)."""

from __future__ import annotations

import json

from hostile import Hostile, honest
from shared import one_line_exit_2, run
from test_hostile_servers import manifest, prompts


def test_a_foreign_manifest_cannot_write_into_another_runs_folder(tmp_path):
    server = Hostile(lambda req, i, n: honest())
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with server.running() as url:
        ma = manifest(a, url, {"first": prompts(a / "p.jsonl", 6)})
        r = run("run", str(ma), "--quiet", "--force")
        assert r.returncode == 0, r.stderr
        before = json.loads((a / "run" / "export" / "manifest.json").read_text())
        (b / "run").symlink_to(a / "run")  # B's output leads to A's folder
        mb = manifest(b, url, {"second": prompts(b / "p.jsonl", 2, tag="b")})
        mb.write_text(mb.read_text().replace('name = "hostile"', 'name = "other"'))
        sent = server.served.requests
        line = one_line_exit_2(run("run", str(mb), "--quiet", "--force"))
        assert "another manifest" in line and "force_output" in line, line
        assert server.served.requests == sent  # nothing was paid for
        # A's own manifest still writes there
        r = run("run", str(ma), "--quiet", "--force")
        assert r.returncode == 0, r.stderr
    after = json.loads((a / "run" / "export" / "manifest.json").read_text())
    assert after["counts"]["samples"] == before["counts"]["samples"] == 6
    assert after["datasets"] == before["datasets"]
    st = json.loads(run("status", str(ma), "--json").stdout)
    assert set(st["datasets"]) == {"first"}


def test_a_foreign_manifest_of_the_same_run_name_is_refused_too(tmp_path):
    """Run names repeat (the same template copied): a manifest elsewhere, of the same ``[run]
    name`` and none of the run's datasets, is not the run's own either. The run's own manifest
    moved to another folder, its datasets kept, still writes."""
    server = Hostile(lambda req, i, n: honest())
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        d.mkdir()
    with server.running() as url:
        ma = manifest(a, url, {"first": prompts(a / "p.jsonl", 6)})
        assert run("run", str(ma), "--quiet", "--force").returncode == 0
        before = json.loads((a / "run" / "export" / "manifest.json").read_text())
        (b / "run").symlink_to(a / "run")
        mb = manifest(b, url, {"second": prompts(b / "p.jsonl", 2, tag="b")})  # same run name
        sent = server.served.requests
        line = one_line_exit_2(run("run", str(mb), "--quiet", "--force"))
        assert "another manifest" in line and "force_output" in line, line
        assert server.served.requests == sent
        # the run's own manifest, moved: the same datasets, the same folder through a link
        (c / "run").symlink_to(a / "run")
        mc = c / "m.toml"
        mc.write_text(ma.read_text().replace(str(a / "run"), str(c / "run")))
        r = run("run", str(mc), "--quiet", "--force")
        assert r.returncode == 0, r.stderr
    after = json.loads((a / "run" / "export" / "manifest.json").read_text())
    assert after["counts"]["samples"] == before["counts"]["samples"] == 6
    assert after["datasets"] == before["datasets"]
