"""Golden reconstruction files (tests/golden, written by make_golden.py with the real
tokenizers), checked three ways: our code still produces them, every reasoning shape gives the
same ids, and, where the model's chat template renders the final assistant turn verbatim, the
golden ids equal that rendering (an oracle independent of our format code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cases import bfcl_tools
from conftest import PROMPTS, REAL
from draftdata.records.wire import messages_of, view_from_record
from draftdata.tokens.reconstruct import reconstruct
from oracle import oracle_ids

GOLDEN = sorted((Path(__file__).parent / "golden").glob("reconstruct_*.json"))
# where the template's text and the real token stream differ at the prompt/answer boundary:
# Qwen3.5's prompt ends "<think>\n" (its own id), the template joins that "\n" with the answer's
TEMPLATE_BOUNDARY = {("qwen3.5", "empty_reasoning")}


def _cases():
    for path in GOLDEN:
        doc = json.loads(path.read_text(encoding="utf-8"))
        key = path.stem.removeprefix("reconstruct_")
        for case in doc["cases"]:
            yield pytest.param(key, doc, case, id=f"{key}/{case['name']}")


def test_golden_files_cover_the_formats():
    keys = {p.stem.removeprefix("reconstruct_") for p in GOLDEN}
    assert keys >= {"kimi-k2", "qwen3", "qwen3.5", "deepseek-v3", "deepseek-v4"}


@pytest.mark.parametrize(("key", "doc", "case"), list(_cases()))
def test_every_reasoning_shape_reconstructs_to_the_golden_ids(bound, key, doc, case):
    b = bound(key)
    assert b.tokenizer.sha256 == doc["tokenizer_sha256"]
    tools = bfcl_tools(PROMPTS / "BFCL_v4_multiple.json")[0] if case["use_tools"] else ()
    if b.format.think is not None and case["reasoning"] is not None:
        assert {"reasoning_content", "reasoning", "reasoning_details"} <= set(case["responses"])
    for shape, resp in case["responses"].items():
        s = reconstruct(b, messages_of(case["messages"]), view_from_record(resp), tools=tools)
        assert s.input_ids == case["input_ids"], shape
        assert s.prompt_len == case["prompt_len"]
        assert s.loss_mask == [False] * s.prompt_len + [True] * (len(s.input_ids) - s.prompt_len)
        assert s.token_source == "reconstructed"
        resp_ids = s.response_ids
        if case["finish"] == "length":
            assert resp_ids[-1] not in b.stop_ids
        else:
            assert resp_ids[-1] == b.end_id and resp_ids.count(b.end_id) == 1
        # content and reasoning text never produce control ids: the only control ids in the
        # answer are the format's own markers
        assert {i for i in resp_ids if i in b.tokenizer.control_ids} <= set(b.ids.values())


@pytest.mark.parametrize(("key", "doc", "case"), [c for c in _cases() if c.values[2]["template"]])
def test_golden_ids_equal_the_models_own_template(bound, key, doc, case):
    if (key, case["name"]) in TEMPLATE_BOUNDARY:
        pytest.skip("documented boundary difference (see TEMPLATE_BOUNDARY)")
    b = bound(key)
    tok = b.tokenizer
    msg = {"role": "assistant", "content": case["content"]}
    if case["reasoning"] is not None or b.format.think is not None:
        msg["reasoning_content"] = case["reasoning"] or ""
    if case["tool_calls"]:
        calls = case["tool_calls"]
        if key == "qwen3.5":  # its template iterates over an arguments object
            calls = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in calls
            ]
        msg["tool_calls"] = calls
    tools = bfcl_tools(PROMPTS / "BFCL_v4_multiple.json")[0] if case["use_tools"] else None
    bos = getattr(tok, "config", {}).get("bos_token")
    kwargs = {
        "bos_token": bos.get("content") if isinstance(bos, dict) else (bos or ""),
        "eos_token": "",
        "preserve_thinking": True,
    }
    expected = oracle_ids(
        tok,
        tok.chat_template,
        [*case["messages"], msg],
        tools,
        add_generation_prompt=False,
        **kwargs,
    )
    ours = case["input_ids"]
    # the template closes the turn with the end marker and, for ChatML-style formats, a "\n"
    # that belongs to the next turn's framing, not to the answer
    while expected and expected[-1] != b.end_id and tok.decode(expected[-1:]).strip() == "":
        expected = expected[:-1]
    assert ours == expected, f"ours: {tok.decode(ours)!r}\ntemplate: {tok.decode(expected)!r}"


def test_kimi_template_drops_final_reasoning_unless_preserve_thinking(bound):
    """DESIGN.md: the Kimi K2.5 template is not a transcript of generation."""
    b = bound("kimi-k2")
    doc = json.loads((Path(__file__).parent / "golden" / "reconstruct_kimi-k2.json").read_text())
    case = doc["cases"][0]
    msg = {"role": "assistant", "content": case["content"], "reasoning_content": case["reasoning"]}
    plain = oracle_ids(
        b.tokenizer,
        b.tokenizer.chat_template,
        [*case["messages"], msg],
        add_generation_prompt=False,
    )
    assert b.tokenizer.decode(plain).count(case["reasoning"]) == 0
    assert plain != case["input_ids"]


def test_deepseek_v3_reasoning_without_think_tokens_is_refused(bound):
    """DeepSeek V3's vocabulary has no think tokens, so an answer with reasoning cannot be laid
    out in ids: reconstruct refuses it with its documented reason instead of inventing markers.
    That the vocabulary lacks them is read from the tokenizer files, not from our format code."""
    from draftdata.errors import ReconstructError
    from draftdata.records import ApiView

    folder = Path(REAL["deepseek-v3"][0])
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    added = {t["content"] for t in spec["added_tokens"]}
    assert len(added) > 800 and "<｜Assistant｜>" in added  # the real file, read right
    assert not {t for t in added if "think" in t.lower()}
    assert not {"<think>", "</think>"} & set(spec["model"]["vocab"])
    b = bound("deepseek-v3")
    assert b.format.think is None  # our format agrees with the file
    user = messages_of([{"role": "user", "content": "q"}])
    with pytest.raises(ReconstructError) as refused:
        reconstruct(b, user, ApiView(content="a", reasoning="r", finish_reason="stop"))
    assert refused.value.reason == "reasoning_without_think_grammar"
    assert "has no think markers" in str(refused.value)
    # the refusal is for the reasoning alone: the same answer without it reconstructs
    s = reconstruct(b, user, ApiView(content="a", reasoning=None, finish_reason="stop"))
    assert s.response_ids == [*b.tokenizer.encode("a"), b.end_id]


@pytest.mark.parametrize(("key", "doc", "case"), [c for c in _cases() if c.values[2]["tool_calls"]])
def test_tool_calls_survive_a_servers_view_of_the_ids(bound, key, doc, case):
    """Golden answer ids -> what a server's reasoning and tool parsers would return -> our
    reconstruction: the same ids (the response grammar inverted, then applied)."""
    from draftdata.formats import derive_view

    b = bound(key)
    answer = case["input_ids"][case["prompt_len"] :]
    view = derive_view(b, answer, case["finish"])
    assert [c.name for c in view.tool_calls] == [c["function"]["name"] for c in case["tool_calls"]]
    tools = bfcl_tools(PROMPTS / "BFCL_v4_multiple.json")[0] if case["use_tools"] else ()
    s = reconstruct(b, messages_of(case["messages"]), view, tools=tools)
    assert s.input_ids == case["input_ids"]
