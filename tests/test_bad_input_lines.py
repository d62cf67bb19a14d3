"""Trust nothing a file or a server sends (issue 25): a binary file where text belongs, a
base_url that is not a URL, a damaged ledger and a port out of range are one line naming the
problem and the fix (exit 2), never an internal error; a credential in a base_url is never
printed or stored. Each case failed before the change it guards."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GROUNDTRUTH, ROOT
from draftdata.store import codec
from servers import manifest, replay_server
from shared import SMOLLM2, UNIQUE, one_line_exit_2, run, write_prompts

#: a PNG's signature and bytes no UTF-8 decoder accepts, over several lines
BINARY = (
    b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00\x00\rIHDR\n\xc3\x28\xa0\xa1\xe2\x28\xa1\n\xf0\x28\x8c\xbc\n"
)


# --- a binary file where text belongs -----------------------------------------------------------
@pytest.mark.parametrize("cmd", ["plan", "generate", "status"])
def test_a_binary_manifest_is_one_line(cmd, tmp_path):
    bad = tmp_path / "manifest.toml"
    bad.write_bytes(BINARY)
    line = one_line_exit_2(run(cmd, str(bad)))
    assert str(bad) in line and "UTF-8" in line and "TOML" in line


def test_a_binary_format_file_is_one_line(tmp_path):
    bad = tmp_path / "format.toml"
    bad.write_bytes(BINARY)
    line = one_line_exit_2(run("audit", "-t", SMOLLM2, "-f", str(bad)))
    assert str(bad) in line and "UTF-8" in line and "TOML" in line


def test_a_binary_format_file_named_by_a_manifest_is_one_line(tmp_path):
    bad = tmp_path / "format.toml"
    bad.write_bytes(BINARY)
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    m.write_text(m.read_text().replace('format = "chatml"', f'format = "{bad}"'))
    line = one_line_exit_2(run("plan", str(m)))
    assert str(bad) in line and "UTF-8" in line


def test_audit_data_that_is_binary_is_one_line(tmp_path):
    bad = tmp_path / "gt.jsonl"
    bad.write_bytes(BINARY)
    line = one_line_exit_2(run("audit", "-t", SMOLLM2, "-f", "chatml", "--data", str(bad)))
    assert str(bad) in line and "UTF-8" in line and "JSONL" in line


def _mixed(tmp_path: Path, n: int = 6) -> Path:
    """Ground-truth lines with one binary line among them."""
    lines = GROUNDTRUTH.read_bytes().splitlines(keepends=True)[:n]
    p = tmp_path / "mixed.jsonl"
    p.write_bytes(b"".join(lines[:3]) + b'\xff\xfe{"bad": \xc3\x28}\n' + b"".join(lines[3:]))
    return p


def test_audit_data_with_one_binary_line_skips_and_counts_it(tmp_path):
    r = run("audit", "-t", SMOLLM2, "-f", "chatml", "--data", str(_mixed(tmp_path)))
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.returncode in (0, 1), r.stderr
    assert re.search(r"invalid_utf8'?: 1\b", r.stdout + r.stderr), r.stdout


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_reconstruct_skips_and_counts_a_binary_line(jobs, tmp_path):
    out = tmp_path / "out.jsonl"
    r = run(
        "reconstruct", str(_mixed(tmp_path)), "-t", SMOLLM2, "-f", "chatml", "-o", str(out),
        "--jobs", jobs,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "invalid_utf8: 1" in r.stderr
    assert len(out.read_text().splitlines()) == 6


def test_a_binary_dataset_source_is_counted_not_a_crash(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_bytes(BINARY)
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", bad, limit=2)
    line = one_line_exit_2(run("generate", str(m), "--quiet"))
    assert "gave no prompts" in line and "invalid_utf8" in line


@pytest.mark.parametrize("kind", ["not_gzip", "truncated"])
def test_a_damaged_gzip_dataset_source_is_one_line(kind, tmp_path):
    src = tmp_path / "p.jsonl.gz"
    if kind == "not_gzip":
        src.write_bytes(BINARY)
    else:
        whole = gzip.compress(GROUNDTRUTH.read_bytes()[:20000])
        src.write_bytes(whole[: len(whole) // 2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    line = one_line_exit_2(run("generate", str(m), "--quiet"))
    assert str(src) in line and "gzip" in line


# --- a base_url that is not a URL ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1/v1", "IPv6"),
        ("http://[fe80::zz]:8000/v1", "IPv6"),
        ("http://127.0.0.1:99999/v1", "port"),
        ("http://127.0.0.1:0/v1", "port"),
        ("http://127.0.0.1:abc/v1", "port"),
        ("http:///v1", "host"),
    ],
)
def test_a_base_url_that_is_not_a_url_is_refused_on_load(url, why, tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, url, src, limit=2)
    line = one_line_exit_2(run("plan", str(m)))
    assert "backends.api.base_url" in line and why in line
    assert "http://127.0.0.1:8000/v1" in line  # the fix: what a base_url looks like


@pytest.mark.parametrize(
    "url",
    [
        "htp://user:s3cret@host/v1",
        "http://user:s3cret@[::1/v1",
        "http://user:s3cret@127.0.0.1:99999/v1",
        "http://127.0.0.1:99999/v1?api-key=s3cret",
    ],
)
def test_a_malformed_base_url_is_refused_without_its_secret(url, tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, url, src, limit=2)
    line = one_line_exit_2(run("plan", str(m)))
    assert "backends.api.base_url" in line
    assert "s3cret" not in line and "***" in line


def test_redact_url_hides_query_credentials_and_keeps_the_rest():
    from draftdata.config import redact_url

    url = (
        "http://h:8/v1?api-version=2024&api-key=A1&API_KEY=A2&key=A3&token=A4&access_token=A5"
        "&secret=A6&password=A7&sig=A8&Authorization=A9&x-goog-sig=A10#frag"
    )
    shown = redact_url(url)
    assert not any(f"A{i}" in shown for i in range(1, 11)), shown
    assert shown.startswith("http://h:8/v1?api-version=2024&api-key=***&") and shown.endswith(
        "#frag"
    )
    assert redact_url("http://u:p@[::1]:8000/v1?token=t") == "http://***@[::1]:8000/v1?token=***"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


def test_a_credential_in_the_query_of_base_url_is_redacted_everywhere_stored(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:4])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url + "?API-Key=TOPSECRET1&access_token=TOPSECRET2", src, limit=4)
        r = run("generate", str(m), "--quiet")
    # the endpoint's path goes before the query: the run is answered (every request was a 404)
    assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    done = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]["done"]
    assert done == 4
    secrets = ("TOPSECRET1", "TOPSECRET2")
    raw = b"".join(p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert not any(s.encode() in raw for s in secrets)
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    try:
        (stored,) = db.execute("SELECT value FROM meta WHERE key='manifest'").fetchone()
        texts = [
            codec.unpack_text(b) or ""
            for row in db.execute("SELECT request, response FROM attempts")
            for b in row
        ]
    finally:
        db.close()
    base = json.loads(stored)["backends"]["api"]["base_url"]
    assert base.endswith("/v1?API-Key=***&access_token=***"), base
    assert texts and not any(s in t for t in texts for s in secrets)
    assert not any(s in r.stdout + r.stderr for s in secrets)
    st = run("status", str(m))
    assert not any(s in st.stdout + st.stderr for s in secrets)


# --- a damaged ledger ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A small run against the replay server, exported: (manifest, run folder, good ledger)."""
    tmp = tmp_path_factory.mktemp("run")
    src = write_prompts(tmp / "p.jsonl", UNIQUE[:30])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp, url, src, limit=30, turns="first")
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
    r = run("export", str(tmp / "run"))
    assert r.returncode == 0, r.stderr
    good = (tmp / "run" / "ledger.sqlite").read_bytes()
    return m, tmp / "run", good


def _damage_table(ledger: Path, good: bytes, table: str) -> None:
    """The ledger with ``table``'s root page overwritten by garbage (the rest intact: it opens)."""
    ledger.write_bytes(good)
    db = sqlite3.connect(ledger)
    try:
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
        (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (table,)).fetchone()
    finally:
        db.close()
    data = bytearray(good)
    start = (root - 1) * page_size
    data[start : start + page_size] = bytes(range(7, 256, 3)) * (page_size // 83) + b"\xa5" * (
        page_size % 83
    )
    ledger.write_bytes(bytes(data))


@pytest.mark.parametrize("cmd", ["status", "report"])
def test_a_damaged_ledger_is_one_ledger_line(cmd, finished_run):
    m, run_dir, good = finished_run
    ledger = run_dir / "ledger.sqlite"
    try:
        _damage_table(ledger, good, "attempts")
        line = one_line_exit_2(run(cmd, str(m if cmd == "status" else run_dir)))
        assert str(ledger) in line and "damaged" in line and "backup" in line
    finally:
        ledger.write_bytes(good)


@pytest.mark.parametrize("cmd", ["status", "report", "export"])
def test_a_ledger_of_garbage_is_one_line(cmd, finished_run):
    m, run_dir, good = finished_run
    ledger = run_dir / "ledger.sqlite"
    try:
        ledger.write_bytes(bytes(range(256)) * 64)
        line = one_line_exit_2(run(cmd, str(m if cmd == "status" else run_dir)))
        assert str(ledger) in line
    finally:
        ledger.write_bytes(good)


def test_a_damaged_ledger_opened_for_writing_is_one_line(finished_run):
    """SQLite's integrity check answers over two lines; the error stays one."""
    _, run_dir, good = finished_run
    ledger = run_dir / "ledger.sqlite"
    try:
        _damage_table(ledger, good, "attempts")
        line = one_line_exit_2(run("export", str(run_dir)))
        assert str(ledger) in line and "damaged" in line
    finally:
        ledger.write_bytes(good)


# --- a port out of range -----------------------------------------------------------------------
@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_replay_server_refuses_a_port_out_of_range(port):
    cmd = [sys.executable, "-m", "draftdata", "replay-server", str(GROUNDTRUTH), "--port", port]
    try:  # before the fix it listened on another port, and served until killed
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"--port {port} was not refused: {e.stderr!r}") from None
    line = one_line_exit_2(r)
    assert "--port" in line and "65535" in line


def test_bind_refuses_a_port_out_of_range():
    from draftdata.devtools.replay import _bind
    from draftdata.errors import InputError

    with pytest.raises(InputError, match="65535"):
        _bind("127.0.0.1", 70000)


def test_an_invalid_format_file_points_at_help_that_exists(tmp_path):
    bad = tmp_path / "format.toml"
    bad.write_text('name = "x"\nversion = "1"\nno_such_key = 1\n')
    line = one_line_exit_2(run("audit", "-t", SMOLLM2, "-f", str(bad)))
    assert "no_such_key" in line and "--help-toml" not in line
    page = "docs/tokenizers-and-formats.md"
    assert page in line and "## Chat formats" in (ROOT / page).read_text(), line


def test_a_jsonl_source_is_read_a_line_at_a_time(tmp_path):
    """The reader held every line of the file before its first record (a tuple of the file)."""
    import tracemalloc
    from collections import Counter

    from draftdata.sources import iter_json_records

    big = tmp_path / "big.jsonl"
    line = json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]}) + "\n"
    big.write_text(line * 10_000)  # 10 MB
    tracemalloc.start()
    try:
        records = iter_json_records(big, Counter())
        assert next(records)["messages"][0]["content"] == "x" * 1000
        peak = tracemalloc.get_traced_memory()[1]
        records.close()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak
