"""Versions of a chat format override only what changed (issue 27 item 6).

Every family renders through the one loop of ``ChatFormat.render_prompt`` (validator ->
normaliser -> role hooks); a version is ``dataclasses.replace(BASE, ...)`` of its base, so what
it names is all that differs, and a new version is one ``replace`` call."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from draftdata.errors import FormatError
from draftdata.formats import BUILTIN, ChatFormat, Special, Text, get_format
from draftdata.formats.deepseek import DEEPSEEK_R1, DEEPSEEK_V3, DEEPSEEK_V31
from draftdata.formats.qwen import QWEN3, QWEN3_THINKING, QWEN35
from draftdata.records import Message, ToolCall
from draftdata.tokens.target import Target

#: each version, its base, and the fields it names (everything else is the base's)
VERSIONS = [
    (
        QWEN3_THINKING,
        QWEN3,
        {"name", "description", "think", "generation_prompt", "generation_prompt_no_think"},
    ),
    (
        QWEN35,
        QWEN3,
        {
            "name",
            "description",
            "think",
            "generation_prompt",
            "trim_content",
            "tools_header",
            "tools_footer",
            "call_grammar",
            "tools_before_system",
            "thinks_every_answer",
            "reasoning_strip",
            "first_tool_opens_turn",
            "late_system",
        },
    ),
    (
        DEEPSEEK_R1,
        DEEPSEEK_V3,
        {"name", "description", "markers", "think", "generation_prompt", "drops_history_reasoning"},
    ),
    (
        DEEPSEEK_V31,
        DEEPSEEK_V3,
        {
            "name",
            "description",
            "markers",
            "think",
            "generation_prompt",
            "generation_prompt_no_think",
        },
    ),
]

CONVERSATION = [
    Message("system", "Be brief."),
    Message("user", "Name a prime."),
    Message("assistant", "7.", reasoning="Any prime will do."),
    Message("user", "And an even one?"),
]


def _differing(version: ChatFormat, base: ChatFormat) -> set[str]:
    return {
        f.name
        for f in dataclasses.fields(base)
        if getattr(version, f.name) != getattr(base, f.name)
    }


@pytest.mark.parametrize(
    ("version", "base", "named"), VERSIONS, ids=[v.name for v, _, _ in VERSIONS]
)
def test_a_version_differs_from_its_base_only_in_the_fields_it_names(version, base, named):
    assert isinstance(version, type(base))
    assert _differing(version, base) == named
    # the unnamed fields are the base's own values, not restated copies that could drift
    for f in dataclasses.fields(base):
        if f.name not in named:
            assert getattr(version, f.name) == getattr(base, f.name), f.name


def test_versions_by_replace_keep_the_base_class():
    """Only a version with hooks of its own (DeepSeek V3.1's history and tool calls) has a
    subclass; the others are the base's class with other field values."""
    assert type(QWEN3_THINKING) is type(QWEN35) is type(QWEN3)
    assert type(DEEPSEEK_R1) is type(DEEPSEEK_V3)
    assert type(DEEPSEEK_V31) is not type(DEEPSEEK_V3)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_renders_through_the_one_loop(name):
    assert type(BUILTIN[name]).render_prompt is ChatFormat.render_prompt


def test_a_new_version_is_one_replace_call(bound):
    """A test-local version that changes only the generation prompt renders every message as
    its base does, and only the generation prompt differs, down to the token ids."""
    terse = replace(
        QWEN3,
        name="qwen3-terse",
        version="test",
        generation_prompt="<|im_start|>assistant\nTersely: ",
    )
    assert _differing(terse, QWEN3) == {"name", "version", "generation_prompt"}
    ours = terse.render_prompt(CONVERSATION)
    base = QWEN3.render_prompt(CONVERSATION)
    history = QWEN3.render_prompt(CONVERSATION, add_generation_prompt=False)
    assert ours[: len(history)] == base[: len(history)] == history
    assert ours[len(history) :] == [Special("im_start"), Text("assistant\nTersely: ")]
    # thinking off still uses the base's own no-think prompt
    assert terse.render_prompt(CONVERSATION, thinking=False) == QWEN3.render_prompt(
        CONVERSATION, thinking=False
    )
    # the answer grammar is the base's
    kw = {"content": "2.", "reasoning": "Even prime.", "tool_calls": (ToolCall("f", "{}"),)}
    assert terse.render_response(**kw) == QWEN3.render_response(**kw)
    # and it binds to the base's tokenizer: the history's ids are the base's ids
    b = bound("qwen3")
    mine = terse.bind(b.tokenizer)
    assert Target(mine).with_options(add_generation_prompt=False).prompt_ids(
        CONVERSATION
    ) == Target(b).with_options(add_generation_prompt=False).prompt_ids(CONVERSATION)
    assert Target(mine).prompt_ids(CONVERSATION)[-1] != Target(b).prompt_ids(CONVERSATION)[-1]


def test_a_version_can_change_a_hook_switch():
    """V3 with R1's history rule: earlier answers lose what precedes their last ``</think>``;
    every other segment is V3's."""
    msgs = [
        Message("user", "q"),
        Message("assistant", "<think>\nr\n</think>\n\na"),
        Message("user", "again"),
    ]
    dropped = replace(DEEPSEEK_V3, name="deepseek-v3-dropped", drops_history_reasoning=True)
    ours, base = dropped.render_prompt(msgs), DEEPSEEK_V3.render_prompt(msgs)
    assert [s for s in ours if s != Text("\n\na")] == [
        s for s in base if s != Text("<think>\nr\n</think>\n\na")
    ]
    assert Text("\n\na") in ours


def test_refusals_run_before_anything_renders():
    with pytest.raises(FormatError, match="system message must come first"):
        QWEN35.render_prompt([Message("user", "u"), Message("system", "late")])
    # the same conversation renders under the base, where a late system message is a turn
    assert Text("system\nlate") in QWEN3.render_prompt(
        [Message("user", "u"), Message("system", "late")]
    )
    with pytest.raises(FormatError, match="tool schemas"):
        DEEPSEEK_R1.render_prompt([Message("user", "u")], [{"name": "f"}])


def test_prompt_options_are_the_formats_own():
    kimi = get_format("kimi-k2")
    msgs = [*CONVERSATION[1:3], Message("user", "more")]
    kept = kimi.render_prompt(msgs, preserve_thinking=True)
    assert Text("Any prime will do.") in kept
    assert Text("Any prime will do.") not in kimi.render_prompt(msgs)
    with pytest.raises(TypeError, match="preserve_thinking"):
        QWEN3.render_prompt(msgs, preserve_thinking=True)
