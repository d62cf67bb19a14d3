"""DeepSeek V3.1 prompts equal the model's own chat template, tool history included.

The template comes from PyPI (llama.cpp's copy inside llama-cpp-python's source archive, fetched
by ``make install`` into ``.venv/templates``; see fetch_templates.py). llama.cpp changed two
things in its copy, and the test changes them back, counting each so that a different file fails
here instead of passing silently:
- the empty think block it writes after ``<｜Assistant｜>`` (``<think></think>``) is the close
  marker alone in the template embedded in DeepSeek's own checkpoints (and in the model card's
  non-thinking prompt);
- it passes each tool call's arguments through ``tojson`` (its parser hands the template parsed
  objects); the model's template writes the arguments string as it is.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from cases import to_template, tool_conversation
from draftdata.records import ApiView, Message, ToolCall
from draftdata.tokens.target import Target
from oracle import oracle_ids, render

TEMPLATE = Path(sys.prefix) / "templates" / "deepseek-v3.1.jinja"
BOS = "<｜begin▁of▁sentence｜>"


@pytest.fixture(scope="module")
def template() -> str:
    if not TEMPLATE.is_file():
        pytest.fail(f"{TEMPLATE} is missing: run `make install` (it fetches the template)")
    text = TEMPLATE.read_text()
    text, n_think = re.subn(r"<think></think>", "</think>", text)
    text, n_json = re.subn(r"\s*\|\s*tojson", "", text)
    assert (n_think, n_json) == (3, 3), "llama.cpp's V3.1 template changed: re-read it"
    return text


@pytest.fixture(scope="module")
def v31(load):
    from draftdata.formats import get_format

    return get_format("deepseek-v3.1").bind(load("deepseek-v4"))


def _check(b, template: str, messages: list[Message], *, gen: bool = True, thinking: bool = True):
    ours = Target(b).with_options(add_generation_prompt=gen, thinking=thinking).prompt_ids(messages)
    want = oracle_ids(
        b.tokenizer,
        template,
        to_template(messages),
        add_generation_prompt=gen,
        bos_token=BOS,
        thinking=thinking,
    )
    if ours != want:
        pytest.fail(f"ours: {b.tokenizer.decode(ours)!r}\ntemplate: {b.tokenizer.decode(want)!r}")
    return ours


ROUND = tool_conversation("What are the triangle's and the circle's areas?")
ANSWERED = [
    *ROUND,
    Message("assistant", "The triangle's area is 6.0 and the circle's is 19.63."),
    Message("user", "And their perimeters?"),
]
CHAINED = [
    Message("system", "Tools: weather(city), convert(celsius)."),
    Message("user", "How warm is it in Oslo, in Fahrenheit?"),
    Message(
        "assistant",
        "Let me look that up first.",
        tool_calls=(ToolCall("weather", '{"city": "Oslo"}', "call_0"),),
    ),
    Message("tool", '{"celsius": 4}', tool_call_id="call_0"),
    Message("assistant", "", tool_calls=(ToolCall("convert", '{"celsius":4}', "call_1"),)),
    Message("tool", "39.2", tool_call_id="call_1"),
]


@pytest.mark.parametrize("thinking", [True, False])
def test_tool_round_then_a_new_question(v31, template, thinking):
    _check(v31, template, ANSWERED, thinking=thinking)


@pytest.mark.parametrize("gen", [True, False])
def test_a_prompt_that_ends_in_tool_results_gets_no_generation_prompt(v31, template, gen):
    ids = _check(v31, template, ROUND, gen=gen)
    assert ids[-1] == v31.ids["tool_output_end"]


def test_text_before_calls_and_calls_after_tool_results(v31, template):
    _check(v31, template, CHAINED)
    _check(v31, template, [*CHAINED, Message("assistant", "It is 39.2 °F in Oslo.")])


def test_an_earlier_answer_keeps_what_follows_its_first_close_marker(v31, template):
    """The template splits an earlier answer once, at its first ``</think>``; later ones are
    the answer's text (compared as text: the sentinels of the id oracle would hide them)."""
    msgs = [
        Message("user", "Quote a tag."),
        Message("assistant", "thought</think>The tag is </think> literally."),
        Message("user", "Again?"),
    ]
    ours = v31.render_text(v31.format.render_prompt(msgs))
    assert ours == render(template, to_template(msgs), bos_token=BOS, thinking=True)
    assert ours.count("</think>") == 2  # the turn's opening close marker, the quoted one


def test_the_answer_after_tool_results_is_reconstructed_without_think_markers(v31):
    """After tool results the template adds no generation prompt: the model answers straight
    after the last tool output, in non-thinking mode, so no think marker is laid out, whatever
    the thinking option says."""

    answer = "The triangle's area is 6.0 and the circle's is 19.63."
    prompt = Target(v31).prompt_ids(ROUND)
    for thinking in (None, True, False):
        s = Target(v31, thinking=thinking).reconstruct(ROUND, ApiView(answer, "stop"))
        assert s.input_ids[: len(prompt)] == prompt
        response = s.input_ids[len(prompt) :]
        assert response == [*v31.tokenizer.encode(answer), v31.ids["eos"]]
        assert all(s.loss_mask[len(prompt) :]) and not any(s.loss_mask[: len(prompt)])


def test_tool_schemas_are_still_refused(v31, template):
    """The template drops ``tools`` (the model card puts the tool description in the system
    prompt by hand): rendering them would train on a prompt the model never saw."""
    from draftdata.errors import FormatError

    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    msgs = ROUND[:2]
    assert render(template, to_template(msgs), tools, bos_token=BOS) == render(
        template, to_template(msgs), None, bos_token=BOS
    )
    with pytest.raises(FormatError, match="tool schemas"):
        Target(v31).prompt_ids(msgs, tools)


def test_an_answer_after_tool_results_returned_as_reasoning_is_the_answer(v31):
    """Asked with thinking on, vLLM's and SGLang's DeepSeek V3 reasoning parsers (R1-style)
    split at ``</think>``; the answer after tool results has none, so the whole text comes back
    as reasoning. It is the model's text as written and is laid out as the answer."""
    from draftdata.errors import ReconstructError

    answer = "Both areas are known now: 6.0 and 19.63."
    plain = Target(v31, thinking=True).reconstruct(ROUND, ApiView(answer, "stop"))
    s = Target(v31, thinking=True).reconstruct(ROUND, ApiView(None, "stop", answer))
    assert s.input_ids == plain.input_ids
    assert "reasoning_read_as_answer" in s.warnings
    # asked with thinking off, reasoning after tool results is the user's mistake, said so
    with pytest.raises(ReconstructError, match="thinking off"):
        Target(v31, thinking=False).reconstruct(ROUND, ApiView(None, "stop", answer))
    # a whole answer with its tool calls swallowed as reasoning is not guessed at
    raw = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
    with pytest.raises(ReconstructError, match="control-token text"):
        Target(v31, thinking=True).reconstruct(ROUND, ApiView(None, "stop", raw))
