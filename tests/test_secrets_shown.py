"""No secret in any output, file or page; no raw control byte on a terminal or in the report
(issue 53, items 10-12). Each failed on 42e677c:

10. a refusal whose text holds the key (``Bearer sk-...``) was printed in the closing line and by
    ``status --failed``, and stored in ``work.last_error`` and the attempts table;
11. a ``?code=`` query key (Azure Functions) was kept in the ledger's meta and shown in
    report.html; a URL's password was kept in ``.draftdata.lock`` and printed by an error;
12. terminal escapes in a server's error reached the terminal raw (they set the window title,
    clear the screen, conceal text), and report.html carried raw NUL and ESC bytes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from draftdata.store import codec
from hostile import Hostile, Refusal, honest
from shared import run
from test_hostile_servers import manifest, prompts

KEY = "sk-or-v1-" + "0123456789abcdef" * 4
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[8mhidden"


def _ledger_texts(run_dir: Path) -> list[str]:
    """Every text the ledger keeps about failures and the run: the work table's errors, every
    attempt's stored response (unpacked), and the meta table."""
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    try:
        out = [str(e) for (e,) in db.execute("SELECT last_error FROM work")]
        out += [codec.unpack_text(b) or "" for (b,) in db.execute("SELECT response FROM attempts")]
        out += [f"{k}={v}" for k, v in db.execute("SELECT * FROM meta")]
        return out
    finally:
        db.close()


def test_a_refusal_that_quotes_the_key_and_holds_escapes_shows_neither(tmp_path, monkeypatch):
    def refuse(req: dict[str, Any], i: int, n: int) -> Refusal:
        msg = f"bad request with Bearer {KEY} {ESCAPES}"
        return Refusal(400, json.dumps({"error": {"message": msg}}).encode())

    server = Hostile(refuse)
    src = prompts(tmp_path / "p.jsonl", 3)
    monkeypatch.setenv("HOSTILE_KEY", KEY)
    with server.running() as url:
        m = manifest(tmp_path, url, {"d": src}, backend='api_key_env = "HOSTILE_KEY"')
        r = run("generate", str(m))
    assert "Traceback" not in r.stderr, r.stderr
    assert "bad request with Bearer" in r.stderr, r.stderr  # the server's words are still said
    failed = run("status", str(m), "--failed")
    for where, text in (("closing line", r.stderr), ("status --failed", failed.stdout)):
        assert KEY not in text and KEY[:20] not in text, f"{where}: {text}"
        assert "\x1b" not in text and "\x07" not in text, f"{where}: {text!r}"
    for text in _ledger_texts(tmp_path / "run"):
        assert KEY[:20] not in text, text[:300]


def test_a_query_key_and_a_url_password_are_kept_nowhere(tmp_path):
    server = Hostile(lambda req, i, n: honest())
    src = prompts(tmp_path / "p.jsonl", 2)
    with server.running() as url:
        m = manifest(tmp_path, url + "?code=AZUREFUNCTIONSECRET", {"d": src})
        r = run("run", str(m), "--quiet", "--force")
        assert r.returncode == 0, r.stderr
        rep = run("report", str(tmp_path / "run"))
        assert rep.returncode == 0, rep.stderr
    run_dir = tmp_path / "run"
    for text in _ledger_texts(run_dir):
        assert "AZUREFUNCTIONSECRET" not in text, text[:300]
    pages = [p for p in run_dir.rglob("*.html")]
    assert pages
    for page in pages:
        assert b"AZUREFUNCTIONSECRET" not in page.read_bytes(), page
    # a password in a URL on the command line: not in the lock, the meta, or an error
    bad = run(
        "hidden-states",
        str(m),
        "--server",
        "http://user:URLPASSWORD99@127.0.0.1:9/v1",
        "-o",
        str(tmp_path / "hs"),
    )
    assert bad.returncode != 0
    assert "URLPASSWORD99" not in bad.stderr + bad.stdout, bad.stderr
    score = run("score", str(m), "--model", "http://user:URLPASSWORD99@127.0.0.1:9/v1")
    assert "URLPASSWORD99" not in score.stderr + score.stdout, score.stderr
    for f in run_dir.rglob("*"):
        if f.is_file() and f.suffix != ".sqlite":
            assert b"URLPASSWORD99" not in f.read_bytes(), f
    for text in _ledger_texts(run_dir):
        assert "URLPASSWORD99" not in text, text[:300]


def test_control_bytes_in_answers_reach_no_page_raw(tmp_path):
    server = Hostile(lambda req, i, n: honest(f"Paris.\x00 {ESCAPES} done"))
    src = prompts(tmp_path / "p.jsonl", 2)
    with server.running() as url:
        m = manifest(tmp_path, url, {"d": src})
        r = run("run", str(m), "--quiet", "--force")
        assert "Traceback" not in r.stderr, r.stderr
        rep = run("report", str(tmp_path / "run"))
        assert rep.returncode == 0, rep.stderr
    pages = list((tmp_path / "run").rglob("*.html"))
    assert pages
    for page in pages:
        raw = page.read_bytes()
        assert b"\x00" not in raw and b"\x1b" not in raw and b"\x07" not in raw, page
