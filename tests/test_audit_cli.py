"""`draftdata audit` end to end, as a user runs it (a real subprocess)."""

from __future__ import annotations

import json

import pytest

from conftest import GROUNDTRUTH, REAL, TOKENIZERS
from shared import run


def test_kimi_wrong_pin_exits_1_and_names_the_real_id():
    r = run(
        "audit",
        "--tokenizer",
        str(TOKENIZERS / "kimi-k2"),
        "--format",
        "kimi-k2",
        "--expect",
        "im_end=163533",
    )
    assert r.returncode == 1
    assert (
        "163533 decodes to 'chas', an ordinary token; <|im_end|> is 163586" in r.stdout + r.stderr
    )


def test_kimi_right_pin_exits_0():
    r = run(
        "audit",
        "--tokenizer",
        str(TOKENIZERS / "kimi-k2"),
        "--format",
        "kimi-k2",
        "--expect",
        "im_end=163586",
        "--expect",
        "<think>=163606",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout


@pytest.mark.parametrize("key", list(REAL))
def test_real_tokenizers_pass_and_json_has_marker_ids(key, tmp_path):
    spec, fmt, tpl = REAL[key]
    args = ["audit", "--tokenizer", spec, "--format", fmt, "--json", str(tmp_path / "a.json")]
    if tpl:
        args += ["--chat-template", str(tpl)]
    r = run(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "a.json").read_text())
    ids = {m["text"]: m["id"] for m in doc["markers"]}
    assert doc["ok"] is True
    expected = {
        "kimi-k2": ("<|im_end|>", 163586),
        "qwen3": ("<think>", 151667),
        "llama3": ("<|eot_id|>", 128009),
        "smollm2": ("<|im_end|>", 2),
        "smollm2-gguf": ("<|im_end|>", 2),
        "deepseek-v4": ("<think>", 128821),
        "qwen3.5": ("<|im_end|>", 248046),
        "deepseek-v3": ("<｜end▁of▁sentence｜>", 1),
    }
    text, tid = expected[key]
    assert ids[text] == tid


def test_confusables_report(tmp_path):
    out = tmp_path / "k.json"
    run("audit", "-t", str(TOKENIZERS / "kimi-k2"), "-f", "kimi-k2", "--json", str(out))
    c = json.loads(out.read_text())["confusables"]
    lookalike_ids = {e["id"] for e in c["ordinary_lookalikes"]["<|im_end|>"]["examples"]}
    assert 105815 in lookalike_ids  # " <|\n", the README's example
    assert {a["text"] for a in c["added_tokens_matched_in_text"]} >= {"<think>", "</think>"}
    out2 = tmp_path / "d.json"
    run("audit", "-t", str(TOKENIZERS / "deepseek-v3"), "-f", "deepseek-v3", "--json", str(out2))
    c2 = json.loads(out2.read_text())["confusables"]
    assert "<｜Assistant｜>" in {a["text"] for a in c2["added_tokens_matched_in_text"]}


def test_data_histogram_shows_finished_outputs_end_with_im_end(tmp_path):
    out = tmp_path / "s.json"
    r = run(
        "audit",
        "--tokenizer",
        str(TOKENIZERS / "smollm2"),
        "--format",
        "chatml",
        "--data",
        str(GROUNDTRUTH),
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(out.read_text())["data"]
    assert d["finished"] == 184 and d["finished_ending_with_end"] == 184
    assert d["last_token_histogram"][0] == {
        "id": 2,
        "text": "<|im_end|>",
        "kind": "special",
        "count": 184,
        "is_end_of_turn": True,
    }
    assert "all 184 finished outputs end with 2 (<|im_end|>)" in r.stdout


def test_data_with_wrong_end_marker_fails(tmp_path):
    """Audit SmolLM2 outputs against a format whose end marker is <|endoftext|>."""
    fmt = tmp_path / "wrong.toml"
    fmt.write_text(
        'name = "chatml-eot"\nversion = "1"\nbase = "chatml"\n'
        'end_of_turn = "eot"\n[markers]\neot = "<|endoftext|>"\n'
    )
    r = run("audit", "-t", str(TOKENIZERS / "smollm2"), "-f", str(fmt), "--data", str(GROUNDTRUTH))
    assert r.returncode == 1
    assert "184 of 184 finished outputs do not end" in r.stdout + r.stderr


def test_mispinned_toml_format_fails_with_the_real_id(tmp_path):
    fmt = tmp_path / "kimi-bad.toml"
    fmt.write_text(
        'name = "kimi-seed"\nversion = "0"\nbase = "kimi-k2"\n'
        '[markers]\nim_end = { text = "<|im_end|>", id = 163533 }\n'
    )
    r = run("audit", "-t", str(TOKENIZERS / "kimi-k2"), "-f", str(fmt))
    assert r.returncode == 1
    assert "pinned id 163533 decodes to 'chas', an ordinary token; <|im_end|> is 163586" in (
        r.stdout + r.stderr
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-t", "/nonexistent/tok", "-f", "chatml"], "no such file or folder"),
        (["-t", str(TOKENIZERS / "smollm2"), "-f", "nosuch"], "unknown format 'nosuch'"),
        (
            ["-t", str(TOKENIZERS / "smollm2"), "-f", "chatml", "--expect", "im_end"],
            "write NAME=ID",
        ),
        (["-t", str(TOKENIZERS / "smollm2"), "-f", "kimi-k2"], "not a special or added token"),
    ],
)
def test_bad_input_is_one_line_not_a_traceback(args, needle):
    r = run("audit", *args)
    assert r.returncode in (1, 2)
    assert needle in r.stdout + r.stderr
    assert "Traceback" not in r.stderr
