"""A backend kind from outside draftdata, found and read with no code of draftdata's changed
(issue 39): ``tests/plugins/anthropic_messages.py`` is one file, installed by one entry point in
the ``draftdata.backends`` group (a dist-info folder on the path, as pip writes one). `draftdata
generate` and `export` find it with no import by hand; its answers are stored in Anthropic's
Messages shape and read back by the plugin's own reader, and the exported ids equal the model's
own chat template over the conversation (transformers). Before, a kind had to be imported by
hand, and an answer stored in any shape but OpenAI's was quarantined by the tokens stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from conftest import PROMPTS, ROOT, TOKENIZERS

PLUGINS = ROOT / "tests" / "plugins"


class Messages(BaseHTTPRequestHandler):
    """Anthropic's Messages API as its documentation shapes an answer: the last user message
    answered in two text blocks."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.bodies.append(body)  # type: ignore[attr-defined]
        last = body["messages"][-1]["content"]
        answer = {
            "id": f"msg_{len(self.server.bodies)}",  # type: ignore[attr-defined]
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [
                {"type": "text", "text": "You asked:\n\n"},
                {"type": "text", "text": last[:60]},
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 24},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def messages_url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Messages)
    srv.bodies = []  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", srv.bodies  # type: ignore[attr-defined]
    srv.shutdown()
    srv.server_close()


def installed(site: Path, name: str, module: str) -> Path:
    """A package installed as pip would leave it: a dist-info folder with its entry point."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[draftdata.backends]\n{name} = {module}\n")
    return site


def draftdata(*args: str, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(site), str(PLUGINS), str(ROOT / "src")])
    return subprocess.run(
        [sys.executable, "-m", "draftdata", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
        cwd=cwd,
    )


def manifest(tmp: Path, url: str) -> Path:
    m = tmp / "manifest.toml"
    m.write_text(f"""
[run]
name = "plugin"
output = "run"

[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"

[backends.claude]
kind = "anthropic"
base_url = "{url}"

[[datasets]]
name = "mtbench"
source = "{PROMPTS / "mt_bench_question.jsonl"}"
reader = "mtbench"
backend = "claude"
limit = 3
turns = "all"
""")
    return m


def test_an_installed_backend_plugin_is_found_and_reads_its_own_answers(messages_url, tmp_path):
    url, bodies = messages_url
    site = installed(tmp_path / "site", "anthropic", "anthropic_messages")
    m = manifest(tmp_path, url)
    r = draftdata("generate", str(m), "--quiet", site=site, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(bodies) == 6  # 3 MT-Bench questions, 2 turns each
    # the second turn carries the first answer as the plugin read it from its own shape
    assert bodies[1]["messages"][1]["content"].startswith("You asked:\n\n")
    r = draftdata("export", str(tmp_path / "run"), site=site, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [
        row
        for f in sorted((tmp_path / "run" / "export").glob("shard-*.parquet"))
        for row in pq.read_table(f).to_pylist()
    ]
    assert len(rows) == 6 and {row["token_source"] for row in rows} == {"reconstructed"}
    hf = AutoTokenizer.from_pretrained(TOKENIZERS / "smollm2")
    newline = hf("\n", add_special_tokens=False)["input_ids"]
    for row in rows:
        turns = conversation(row)
        expected = hf(hf.apply_chat_template(turns, tokenize=False), add_special_tokens=False)
        assert row["input_ids"] + newline == expected["input_ids"]
    r = draftdata("status", str(m), site=site, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_plugin_that_fails_to_load_is_named_in_one_line(messages_url, tmp_path):
    url, _bodies = messages_url
    site = installed(tmp_path / "site", "broken", "no_such_module_for_draftdata")
    r = draftdata("plan", str(manifest(tmp_path, url)), site=site, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "backend plugin 'broken'" in line and "fix or uninstall it" in line


def conversation(row: dict) -> list[dict[str, str]]:
    """The conversation a sample ends, from its MT-Bench record: each user turn up to the
    sample's, answered as the server of this test answers."""
    meta = json.loads(row["metadata"])
    lines = (PROMPTS / "mt_bench_question.jsonl").read_text().splitlines()
    rec = next(r for r in map(json.loads, lines) if r["question_id"] == meta["question_id"])
    out: list[dict[str, str]] = []
    for user in rec["turns"][: row["turn"] + 1]:
        out += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": "You asked:\n\n" + user[:60]},
        ]
    return out
