"""A server's view that contradicts itself is never rebuilt as if it were whole (issue 26).

Each view below is what a real server returns when its parser failed on the model's raw output:
``finish_reason: "tool_calls"`` with no call (the tool parser could not read the call, or cut
the content at marker-like text), a truncated Hermes call that vLLM returns as raw content (its
``<tool_call>`` marker then arrives as text), reasoning for a format with no think block, calls
for a format with no tool grammar. The expected ids are the tokenizer library's own encoding
of the raw output (its control tokens matched in the text, as the model's ids are). On
4925d9d the first two were rebuilt silently: ids that differ from the model's, and no label."""

from __future__ import annotations

import json

import pytest

from draftdata.errors import ReconstructError
from draftdata.records import ApiView, Message, ToolCall
from draftdata.tokens.target import Target

USER = (Message("user", "What is the weather in Paris?"),)
PARIS = ToolCall("get_weather", json.dumps({"city": "Paris"}))


def _truth(b, raw: str) -> list[int]:
    return b.tokenizer.encode_as_stock(raw)


@pytest.mark.parametrize("server", ["vllm", "sglang", "auto", "openrouter"])
@pytest.mark.parametrize(
    "key,view",
    [
        # Qwen3 Hermes: the parser could not read the call; the content before it came back
        ("qwen3", ApiView("\n\nLet me check.", "tool_calls", "\nNeed the weather.\n")),
        # Kimi K2: the content cut where the section's marker text began
        ("kimi-k2", ApiView("Let me check.", "tool_calls", "Need the weather.")),
        # no reasoning, no content: nothing but the claim
        ("qwen3", ApiView(None, "tool_calls", "\nNeed the weather.\n")),
    ],
)
def test_tool_calls_finish_without_a_call_is_dropped_not_rebuilt_as_a_plain_answer(
    bound, key, view, server
):
    b = bound(key)
    view = ApiView(**{**view.__dict__, "server": server})
    with pytest.raises(ReconstructError) as e:
        Target(b, thinking=True).reconstruct(USER, view)
    assert e.value.reason == "tool_calls_finish_without_calls"


@pytest.mark.parametrize("server", ["vllm", "auto"])
def test_marker_text_in_the_content_is_labelled_where_the_ids_diverge(bound, server):
    """vLLM's Hermes parser returns a truncated call as raw content: ``<tool_call>`` is then
    text, and rebuilding it as text gives four ordinary ids where the model wrote one."""
    b = bound("qwen3")
    raw = '<think>\nNeed the weather.\n</think>\n\nLet me check.\n\n<tool_call>\n{"name": "get_wea'
    content = raw.split("</think>", 1)[1]
    view = ApiView(content, "length", "\nNeed the weather.\n", server=server)
    s = Target(b, thinking=True).reconstruct(USER, view)
    truth = _truth(b, raw)
    assert s.response_ids != truth  # without the label this would pass as exact
    first = next(i for i, (a, t) in enumerate(zip(s.response_ids, truth, strict=False)) if a != t)
    assert b.tokenizer.decode(truth[first : first + 1]) == "<tool_call>"  # where they diverge
    assert "lossy:control_text_in_answer" in s.warnings, s.warnings


def test_marker_text_in_reasoning_is_labelled(bound):
    b = bound("kimi-k2")
    view = ApiView("Fine.", "stop", "I could call <|tool_call_begin|> here.", server="vllm")
    s = Target(b, thinking=True).reconstruct(USER, view)
    assert "lossy:control_text_in_answer" in s.warnings, s.warnings


def test_a_whole_view_with_no_marker_text_carries_no_such_label(bound):
    b = bound("qwen3")
    raw = "<think>\nNeed the weather.\n</think>\n\nIt is mild; <tool> is not a marker.<|im_end|>"
    view = ApiView(
        "\n\nIt is mild; <tool> is not a marker.", "stop", "\nNeed the weather.\n", server="vllm"
    )
    s = Target(b, thinking=True).reconstruct(USER, view)
    assert [w for w in s.warnings if w.startswith("lossy:")] == []
    assert s.response_ids == _truth(b, raw)


def test_reasoning_for_a_format_with_no_think_block_is_dropped(bound):
    b = bound("smollm2")
    with pytest.raises(ReconstructError) as e:
        Target(b, thinking=None).reconstruct(USER, ApiView("Mild.", "stop", "Let me think."))
    assert e.value.reason == "reasoning_without_think_grammar"


def test_tool_calls_for_a_format_with_no_tool_grammar_are_dropped(bound):
    b = bound("smollm2")
    assert not b.format.has_tool_grammar
    with pytest.raises(ReconstructError) as e:
        Target(b).reconstruct(USER, ApiView(None, "tool_calls", tool_calls=(PARIS,)))
    assert e.value.reason == "tool_calls_without_grammar"


@pytest.mark.parametrize("server", ["vllm", "sglang", "auto", "openrouter"])
def test_reasoning_with_no_answer_after_it_is_labelled(bound, server):
    """vLLM's Qwen3.5 parser cut the reasoning where the model typed ``<tool_call>`` as text
    and returned nothing after it (content null, no call, finish ``stop``): run through vLLM
    0.34.0's own parser by benchmarks/vllm_oracle.py (case q35-typed-tool-call-in-reasoning).
    Rebuilt as ``</think><|im_end|>``, the ids differed from the model's with no label. A
    finished answer that is nothing but reasoning is also what vLLM returns for a model that
    wrote only whitespace after ``</think>`` (whitespace-only content becomes null), so the
    ids after the reasoning are a guess either way."""
    b = bound("qwen3.5")
    raw_head = "<think>\nCalls look like "
    typed = b.tokenizer.encode("<tool_call>")  # typed as text: ordinary ids
    truth = [*_truth(b, raw_head), *typed, *_truth(b, " this.\n</think>\n\nOk.<|im_end|>")]
    view = ApiView(None, "stop", "Calls look like ", server=server)
    s = Target(b, thinking=True).reconstruct(USER, view)
    assert list(s.response_ids) != truth[1:]  # the view cannot give the model's ids back
    assert "lossy:reasoning_without_answer" in s.warnings


def test_an_answer_after_the_reasoning_carries_no_such_label(bound):
    b = bound("qwen3.5")
    s = Target(b, thinking=True).reconstruct(
        USER, ApiView("\n\nOk.", "stop", "\nShort.\n", server="vllm")
    )
    assert not any(w.startswith("lossy:reasoning_without") for w in s.warnings)
    cut = Target(b, thinking=True).reconstruct(
        USER, ApiView(None, "length", "\nShort", server="vllm")
    )
    assert not any(w.startswith("lossy:reasoning_without") for w in cut.warnings)
