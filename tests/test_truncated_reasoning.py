"""An answer cut by `length` inside its reasoning: the model never wrote the close marker, so
the reconstruction must not either (nor an end of turn). The expected ids are the model's own
chat template's rendering of the finished turn, cut where the reasoning text ends."""

from __future__ import annotations

import pytest

from draftdata.records import ApiView, Message
from draftdata.tokens.target import Target
from oracle import oracle_ids

REASONING = "The user asks for two plus two so the answer is four"
THINKING = ["qwen3", "kimi-k2", "deepseek-v4"]


def _close_id(b):
    return b.ids[b.format.think.close]


@pytest.mark.parametrize("key", THINKING)
def test_reasoning_cut_by_length_gets_no_close_marker(bound, key):
    b = bound(key)
    # each of these vocabularies has <think> tokens: a format that lost them must fail here,
    # not skip (test_reconstruct_golden checks the one without them, DeepSeek V3)
    assert b.format.think is not None, f"{key}: no think markers found in this vocabulary"
    user = (Message("user", "What is two plus two?"),)
    view = ApiView(content="", reasoning=REASONING, finish_reason="length")
    s = Target(b, thinking=True).reconstruct(user, view)
    assert _close_id(b) not in s.response_ids
    assert not set(b.stop_ids) & set(s.response_ids)
    # the text the model wrote is all there, up to the cut
    assert b.tokenizer.decode(s.response_ids).rstrip().endswith(REASONING)


def test_qwen3_truncated_reasoning_is_a_prefix_of_the_templates_turn(bound):
    b = bound("qwen3")
    tok = b.tokenizer
    msgs = [{"role": "user", "content": "What is two plus two?"}]
    prompt = oracle_ids(tok, tok.chat_template, msgs, enable_thinking=True)
    turn = [*msgs, {"role": "assistant", "content": "Four.", "reasoning_content": REASONING}]
    full = oracle_ids(tok, tok.chat_template, turn, add_generation_prompt=False)
    assert full[: len(prompt)] == prompt
    answer = full[len(prompt) :]
    # the model's ids up to the end of the reasoning text: cut before "\n</think>"
    close = answer.index(_close_id(b))
    cut = answer[: close - 1]
    assert tok.decode(cut).endswith(REASONING)
    view = ApiView(content="", reasoning=REASONING, finish_reason="length")
    s = Target(b, thinking=True).reconstruct((Message("user", msgs[0]["content"]),), view)
    assert s.input_ids[: s.prompt_len] == prompt
    assert s.response_ids == cut
