"""Issue 25, "trust nothing a server sends": what a rerun changes is seen (backend options that
reach the request body, the server profile, the ids option), the export says the sampling the
requests used, tool arguments that are not JSON are labelled where they are spliced into
Qwen3's Hermes JSON, and a renamed dataset is named as such. Runs against the project's replay
server on loopback; each test failed before the change it guards."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from conftest import GROUNDTRUTH, TOKENIZERS
from servers import manifest, replay_server
from shared import UNIQUE, run, write_prompts


def _settings(run_dir: Path, dataset: str = "gt") -> dict:
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    try:
        (value,) = db.execute(
            "SELECT value FROM meta WHERE key=?", (f"settings:{dataset}",)
        ).fetchone()
    finally:
        db.close()
    return json.loads(value)


def _refused(r, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def test_a_rerun_that_changes_extra_body_server_or_token_ids_is_refused(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:4])
    with replay_server(GROUNDTRUTH) as url:
        body = "extra_body = { temperature = 0.7 }"
        m = manifest(tmp_path, url, src, limit=4, turns="first", extra_backend=body)
        text = m.read_text()
        assert run("generate", str(m), "--quiet").returncode == 0
        # sampling passed through the backend's request body: another temperature
        m.write_text(text.replace("temperature = 0.7 }", "temperature = 0.9 }"))
        r = run("generate", str(m), "--quiet")
        _refused(r, 'extra_body {"temperature": 0.7} -> {"temperature": 0.9}', "new [run] output")
        # another server profile: other request options, another reading of the answers
        m.write_text(text.replace(body, body + '\nserver = "vllm"'))
        _refused(run("generate", str(m), "--quiet"), 'server "auto" -> "vllm"')
        # the exact ids asked for, or not
        m.write_text(text.replace(body, body + '\ntoken_ids = "never"'))
        _refused(run("generate", str(m), "--quiet"), 'token_ids "auto" -> "never"')
        m.write_text(text)
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr


def test_a_ledger_from_before_these_settings_is_rerun_and_records_them(tmp_path):
    """A ledger written by the previous version has no extra_body / server / token_ids in its
    stored settings: a rerun of the same manifest goes on, and stores them from then on."""
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:4])
    run_dir = tmp_path / "run"
    with replay_server(GROUNDTRUTH) as url:
        body = 'extra_body = { temperature = 0.7 }\ntoken_ids = "never"'
        m = manifest(tmp_path, url, src, limit=4, turns="first", extra_backend=body)
        text = m.read_text()
        assert run("generate", str(m), "--quiet").returncode == 0
        old = {
            k: v
            for k, v in _settings(run_dir).items()
            if k not in ("extra_body", "server", "token_ids")
        }
        db = sqlite3.connect(run_dir / "ledger.sqlite")
        with db:
            db.execute("UPDATE meta SET value=? WHERE key='settings:gt'", (json.dumps(old),))
        db.close()
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
        now = _settings(run_dir)
        assert now["extra_body"] == {"temperature": 0.7}
        assert (now["server"], now["token_ids"]) == ("auto", "never")
        # recorded now: a change from here on is seen
        m.write_text(text.replace("temperature = 0.7", "temperature = 1.0"))
        _refused(run("generate", str(m), "--quiet"), "extra_body")


def test_the_export_states_the_sampling_extra_body_overrode(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:3])
    body = (
        "extra_body = { temperature = 0.7, top_k = 20, "
        "chat_template_kwargs = { enable_thinking = false } }"
    )
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=3, turns="first", extra_backend=body)
        assert run("generate", str(m), "--quiet").returncode == 0
    r = run("export", str(tmp_path / "run"))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "run" / "export" / "manifest.json").read_text())
    ds = doc["datasets"]["gt"]
    # the manifest's table asked for 0.0; the requests carried 0.7, and top_k besides
    assert ds["sampling_overrides"] == {"temperature": 0.7, "top_k": 20}
    assert ds["sampling"]["temperature"] == 0.7
    assert ds["sampling"]["max_tokens"] == 256


def test_the_export_of_a_run_without_extra_body_states_no_overrides(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=2, turns="first")
        assert run("generate", str(m), "--quiet").returncode == 0
    assert run("export", str(tmp_path / "run")).returncode == 0
    doc = json.loads((tmp_path / "run" / "export" / "manifest.json").read_text())
    ds = doc["datasets"]["gt"]
    assert ds["sampling_overrides"] == {}
    assert ds["sampling"]["temperature"] == 0.0


# --- tool arguments that are not JSON, in Qwen3's Hermes layout ---------------------------------
def _tool_record(rid: str, arguments: str) -> dict:
    return {
        "id": rid,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": {"type": "object"}},
            }
        ],
        "api_view": {
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
            "finish_reason": "tool_calls",
        },
    }


def test_tool_arguments_that_are_not_json_are_labelled_in_the_hermes_layout(tmp_path):
    src = tmp_path / "in.jsonl"
    recs = [
        _tool_record("not_json", "{city: Paris}"),
        _tool_record("json", '{"city": "Paris"}'),
    ]
    src.write_text("".join(json.dumps(x) + "\n" for x in recs))
    out = tmp_path / "out.jsonl"
    qwen3 = ["-t", str(TOKENIZERS / "qwen3"), "-f", "qwen3", "--no-thinking"]
    r = run("reconstruct", str(src), *qwen3, "-o", str(out))
    assert r.returncode == 0, r.stderr
    rows = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"not_json", "json"}
    assert "lossy:arguments_not_json" in rows["not_json"]["warnings"]
    assert "lossy:arguments_not_json" not in rows["json"]["warnings"]
    assert not [w for w in rows["json"]["warnings"] if w.startswith("lossy:")]
    assert "arguments_not_json: 1" in r.stdout + r.stderr


# --- a renamed dataset ---------------------------------------------------------------------------
def test_a_renamed_dataset_is_named_as_such_not_dropped_as_duplicates(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:4])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=4, turns="first", name="a")
        assert run("generate", str(m), "--quiet").returncode == 0
        m = manifest(tmp_path, url, src, limit=4, turns="first", name="b")
        r = run("generate", str(m), "--quiet")
    _refused(r, "dataset b", 'under dataset "a"', "not in the manifest", "renamed")
    assert "old name" in r.stderr and "new [run] output folder" in r.stderr
    assert "gave no prompts" not in r.stderr


def test_a_dataset_whose_prompts_another_dataset_of_the_manifest_holds_gets_no_rename_hint(
    tmp_path,
):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:4])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=4, turns="first", name="a")
        text = m.read_text()
        second = text[text.index("[[datasets]]") :].replace('name = "a"', 'name = "b"')
        m.write_text(text + second)
        r = run("generate", str(m), "--quiet")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "dataset b" in r.stderr and "gave no prompts" in r.stderr
    assert "duplicate_across_datasets" in r.stderr and "renamed" not in r.stderr
