"""Our prompt rendering equals each model's own chat template (user text kept as text).

The oracle is the template itself, rendered by transformers with sentinels (see oracle.py)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from cases import (
    MULTI_TURN,
    MULTI_TURN_NO_SYSTEM,
    SYSTEM_USER,
    bfcl_tools,
    special_strings_user,
    to_template,
    tool_conversation,
)
from conftest import PROMPTS, REAL
from draftdata.errors import FormatError
from draftdata.tokens.target import Target
from oracle import oracle_ids, render
from shared import kwargs

WITH_TEMPLATE = ["kimi-k2", "qwen3", "qwen3.5", "deepseek-v3", "llama3", "smollm2"]
ARGS_AS_OBJECT = {"qwen3.5"}


def _check(bound, key, messages, tools=None, **opts):
    tok = bound.tokenizer
    ours = Target(bound).with_options(**opts).prompt_ids(messages, tools or ())
    tpl_opts = {}
    if "thinking" in opts and not opts["thinking"]:
        tpl_opts = {"enable_thinking": False, "thinking": False}
    expected = oracle_ids(
        tok,
        tok.chat_template,
        to_template(messages, key in ARGS_AS_OBJECT),
        tools,
        **kwargs(tok),
        **tpl_opts,
    )
    if ours != expected:
        first = next(
            i for i, (a, b) in enumerate(zip([*ours, -1], [*expected, -1], strict=False)) if a != b
        )
        ctx = lambda ids: [tok.token_str(i) for i in ids[max(0, first - 5) : first + 5]]  # noqa: E731
        pytest.fail(
            f"{key}: first difference at {first}: ours {ctx(ours)} vs template "
            f"{ctx(expected)}\nours: {tok.decode(ours)!r}\ntemplate: "
            f"{tok.decode(expected)!r}"
        )
    return ours


@pytest.mark.parametrize("key", WITH_TEMPLATE)
def test_system_and_user(bound, key):
    ids = _check(bound(key), key, SYSTEM_USER)
    assert len(ids) > 10


@pytest.mark.parametrize("key", WITH_TEMPLATE)
def test_multi_turn(bound, key):
    _check(bound(key), key, MULTI_TURN)
    _check(bound(key), key, MULTI_TURN_NO_SYSTEM)


@pytest.mark.parametrize("key", ["kimi-k2", "qwen3", "qwen3.5"])
def test_generation_prompt_without_thinking(bound, key):
    _check(bound(key), key, SYSTEM_USER, thinking=False)


@pytest.mark.parametrize("key", ["kimi-k2", "qwen3", "qwen3.5"])
def test_tools_with_bfcl_schemas(bound, key):
    tools, question = bfcl_tools(PROMPTS / "BFCL_v4_multiple.json")
    b = bound(key)
    _check(b, key, [SYSTEM_USER[0], SYSTEM_USER[1].__class__("user", question)], tools)
    _check(b, key, tool_conversation(question, kimi_ids=key == "kimi-k2"), tools)


@pytest.mark.parametrize("key", ["deepseek-v3", "llama3", "smollm2"])
def test_formats_without_tool_prompt_refuse_schemas_the_template_drops(bound, key):
    tools = bfcl_tools(PROMPTS / "BFCL_v4_multiple.json")[0]
    b = bound(key)
    msgs = to_template(SYSTEM_USER)
    tok = b.tokenizer
    # the model's own template silently drops the schemas ...
    assert render(tok.chat_template, msgs, tools, **kwargs(tok)) == render(
        tok.chat_template, msgs, None, **kwargs(tok)
    )
    # ... so we refuse instead of pretending the model saw them
    with pytest.raises(FormatError, match="tool schemas"):
        Target(b).prompt_ids(SYSTEM_USER, tools)


def test_deepseek_tool_call_history_matches_template(bound):
    question = bfcl_tools(PROMPTS / "BFCL_v4_multiple.json")[1]
    b = bound("deepseek-v3")
    msgs = tool_conversation(question)
    msgs[2] = msgs[2].__class__("assistant", None, tool_calls=msgs[2].tool_calls)
    _check(b, "deepseek-v3", msgs)


def test_deepseek_single_tool_call_is_closed_unlike_the_template(bound):
    """The V3 template never closes a lone tool call; the model does, and so do we."""
    b = bound("deepseek-v3")
    call = tool_conversation("q")[2].tool_calls[:1]
    msgs = [SYSTEM_USER[1], SYSTEM_USER[1].__class__("assistant", None, tool_calls=call)]
    ours = b.render_text(b.format.render_prompt(msgs, add_generation_prompt=False))
    theirs = render(
        b.tokenizer.chat_template,
        to_template(msgs),
        None,
        add_generation_prompt=False,
        **kwargs(b.tokenizer),
    )
    assert ours.endswith("<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>")
    assert theirs.endswith("```<｜tool▁call▁end｜>")


@pytest.mark.parametrize("key", WITH_TEMPLATE)
def test_special_strings_in_user_text_stay_text(bound, key):
    b = bound(key)
    tok = b.tokenizer
    texts = [m.text for m in b.format.markers.values() if m.text in tok.control_by_text]
    msgs = special_strings_user(texts)
    ours = _check(b, key, msgs)
    # user text adds no control ids: the control ids are exactly those of an empty user turn
    blank = Target(b).prompt_ids([msgs[0], msgs[1].__class__("user", "")])
    ctrl = lambda ids: [i for i in ids if i in tok.control_ids]  # noqa: E731
    assert ctrl(ours) == ctrl(blank)
    # the naive path, template render then the stock encode, injects control tokens
    rendered = render(tok.chat_template, to_template(msgs), **kwargs(tok))
    if REAL[key][0].startswith("pkg:") or "kimi" in key:
        naive = tok.encode_as_stock(rendered)  # Kimi's/Qwen's own code: allowed_special="all"
    else:
        hf = AutoTokenizer.from_pretrained(REAL[key][0])
        naive = hf.apply_chat_template(
            to_template(msgs), tokenize=True, add_generation_prompt=True, return_dict=False
        )
        assert (
            hf.apply_chat_template(to_template(msgs), tokenize=False, add_generation_prompt=True)
            == rendered
        )
    injected = len(ctrl(naive)) - len(ctrl(ours))
    assert injected >= len(texts), f"expected the stock path to inject {len(texts)} tokens"
    assert b.end_id in ctrl(naive)[: len(ctrl(naive)) - 2] or key == "deepseek-v3"
