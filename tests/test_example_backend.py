"""The README's "Adding a backend" example is real: examples/echo_backend.py (the README shows
the same text) registers a kind with one call, a manifest with ``kind = "echo"`` validates, and
`draftdata run` over it exports samples whose ids equal the model's own chat template rendered
by transformers and tokenized by the SmolLM2 tokenizer folder: an oracle that shares no code
with draftdata."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from conftest import PROMPTS, ROOT, TOKENIZERS
from draftdata.config import BACKENDS, ManifestError, load_manifest
from draftdata.config.backends import BackendKind, register_backend, unregister_backend
from shared import FIXED, PLUGIN_THEN_CLI, echo_manifest

EXAMPLE = ROOT / "examples" / "echo_backend.py"


@pytest.fixture
def echo():
    """The example imported as ``echo_backend`` (its registration runs), taken out afterwards."""
    spec = importlib.util.spec_from_file_location("echo_backend", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["echo_backend"] = module
    spec.loader.exec_module(module)
    yield module
    unregister_backend("echo")
    del sys.modules["echo_backend"]


def test_the_plugin_page_shows_the_example_file_as_it_is():
    code = EXAMPLE.read_text()
    assert len(code.splitlines()) <= 30
    assert f"```python\n{code}```" in (ROOT / "docs" / "plugins.md").read_text()


def test_one_call_registers_the_kind_and_the_manifest_accepts_it(echo, tmp_path):
    assert BACKENDS["echo"].exact_ids and "echo" in BACKENDS
    m = load_manifest(echo_manifest(tmp_path))
    assert type(m.backends["fixed"]) is echo.EchoCfg and m.backends["fixed"].text == FIXED
    assert all(m.is_ground_truth(d) for d in m.datasets)
    bad = tmp_path / "bad.toml"
    bad.write_text(echo_manifest(tmp_path).read_text().replace("text =", "txt ="))
    with pytest.raises(
        ManifestError, match=r"unknown key 'backends.fixed.txt'; did you mean 'text'"
    ):
        load_manifest(bad)


def test_registration_refuses_a_built_in_kind_and_a_config_without_its_kind(echo):
    with pytest.raises(ValueError, match="built in"):
        register_backend(BackendKind("hf", echo.EchoCfg, "echo_backend:EchoBackend", True, ""))
    with pytest.raises(ValueError, match="Literal"):
        register_backend(BackendKind("other", echo.EchoCfg, "echo_backend:EchoBackend", True, ""))


def test_unregistered_the_kind_is_refused_again(tmp_path):
    assert "echo" not in BACKENDS
    with pytest.raises(ManifestError, match=r"backends\.echo\.kind = 'echo'"):
        load_manifest(echo_manifest(tmp_path))


def test_draftdata_run_on_the_echo_backend_exports_the_templates_ids(tmp_path):
    m = echo_manifest(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", PLUGIN_THEN_CLI, "run", str(m), "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'examples'}{os.pathsep}{ROOT / 'src'}"},
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [
        r
        for f in sorted((tmp_path / "run" / "export").glob("shard-*.parquet"))
        for r in pq.read_table(f).to_pylist()
    ]
    hf = AutoTokenizer.from_pretrained(TOKENIZERS / "smollm2")
    newline = hf("\n", add_special_tokens=False)["input_ids"]
    for row in rows:
        ids, n = row["input_ids"], row["prompt_len"]
        assert row["token_source"] == "engine"
        assert all(row["loss_mask"][n:]) and not any(row["loss_mask"][:n])
        turns = _conversation(row)
        # the template closes the answer with "<|im_end|>\n"; the sample ends at the stop token
        expected = hf(hf.apply_chat_template(turns, tokenize=False), add_special_tokens=False)
        assert ids + newline == expected["input_ids"]
        prompt = hf.apply_chat_template(turns[:-1], tokenize=False, add_generation_prompt=True)
        assert n == len(hf(prompt, add_special_tokens=False)["input_ids"])
    assert sorted((r["dataset"], r["turn"]) for r in rows) == [
        ("mtbench", 0), ("mtbench", 0), ("mtbench", 1), ("mtbench", 1),
        ("sharegpt", 0), ("sharegpt", 0),
    ]  # fmt: skip


def _conversation(row):
    """The conversation a sample answers, read from its source file: the user turns up to this
    one, each answered by the echo backend (mt-bench: the user's own text) or the fixed text."""
    meta = json.loads(row["metadata"])
    if row["dataset"] == "sharegpt":
        records = json.loads((PROMPTS / "sharegpt_v3_first1000.json").read_text())
        rec = next(r for r in records if r["id"] == meta["id"])
        return [
            {"role": "user", "content": rec["conversations"][0]["value"]},
            {"role": "assistant", "content": FIXED},
        ]
    lines = (PROMPTS / "mt_bench_question.jsonl").read_text().splitlines()
    rec = next(r for r in map(json.loads, lines) if r["question_id"] == meta["question_id"])
    return [
        {"role": role, "content": text}
        for text in rec["turns"][: row["turn"] + 1]
        for role in ("user", "assistant")
    ]
