"""Formats declared in TOML, and the engine's own prompt ids as an oracle for chatml."""

from __future__ import annotations

import json

import pytest

from conftest import GROUNDTRUTH
from draftdata.errors import FormatError, MarkerError
from draftdata.formats import get_format
from draftdata.records import Message
from draftdata.tokens.target import Target


def test_engine_prompt_ids_equal_our_chatml_rendering(bound):
    """All 531 ground-truth prompts: the ids the engine fed SmolLM2 equal our rendering
    (including the default system prompt the template inserts)."""
    for key in ("smollm2", "smollm2-gguf"):
        b = bound(key)
        for line in GROUNDTRUTH.read_text().splitlines():
            r = json.loads(line)
            msgs = [Message(m["role"], m["content"]) for m in r["messages"]]
            assert Target(b).prompt_ids(msgs) == r["prompt_ids"], r["id"]


def test_new_format_without_code(tmp_path, load):
    p = tmp_path / "zephyr.toml"
    p.write_text(
        'name = "zephyr-like"\nversion = "1"\nend_of_turn = "eos"\n'
        '[markers]\neos = "<|im_end|>"\nbos = "<|im_start|>"\n'
        '[messages]\nbos = "bos"\ndefault = "<|{role}|>\\n{content}<|im_end|>\\n"\n'
        'generation_prompt = "<|assistant|>\\n"\n'
    )
    fmt = get_format(str(p))
    b = fmt.bind(load("smollm2"))
    ids = Target(b).prompt_ids([Message("user", "hi <|im_end|>")])
    assert ids[0] == 1 and ids.count(2) == 1  # the user's <|im_end|> stayed text
    assert (
        b.tokenizer.decode(ids) == "<|im_start|><|user|>\nhi <|im_end|><|im_end|>\n<|assistant|>\n"
    )


def test_new_version_overrides_only_what_changed(tmp_path, load):
    p = tmp_path / "v2.toml"
    p.write_text(
        'name = "chatml"\nversion = "2"\nbase = "chatml"\n'
        '[messages]\ndefault_system = "Be brief."\n'
    )
    fmt = get_format(str(p))
    assert fmt.version == "2" and fmt.markers == get_format("chatml").markers
    b = fmt.bind(load("smollm2"))
    assert b.tokenizer.decode(Target(b).prompt_ids([Message("user", "x")])).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>"
    )


def test_pin_is_checked_at_bind(tmp_path, load):
    p = tmp_path / "pin.toml"
    p.write_text(
        'name = "c"\nversion = "1"\nbase = "chatml"\n'
        '[markers]\nim_end = { text = "<|im_end|>", id = 3 }\n'
    )
    with pytest.raises(MarkerError, match=r"pinned id 3 decodes to '<repo_name>', a special token"):
        get_format(str(p)).bind(load("smollm2"))
    loose = get_format(str(p)).bind(load("smollm2"), strict=False)
    assert (
        loose.end_id == 3 and not loose.ok
    )  # non-strict keeps the pin so its damage can be measured


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('name = "x"\nversion = "1"\nbogus = 1\n', "bogus: Extra inputs are not permitted"),
        ('name = "x"\n', "version: Field required"),
        (
            'name = "x"\nversion = "1"\nbase = "chatml"\nend_of_turn = "nope"\n',
            "'nope' is used but not",
        ),
        (
            'name = "x"\nversion = "1"\nbase = "kimi-k2"\n[messages]\ndefault = "a"\n',
            "only applies",
        ),
        ('name = "x" version', "invalid TOML"),
    ],
)
def test_bad_format_files_name_the_problem(tmp_path, body, needle):
    p = tmp_path / "f.toml"
    p.write_text(body)
    with pytest.raises(FormatError, match=needle):
        get_format(str(p))


def test_a_declared_think_grammar_can_say_tools_open_inside_the_reasoning(tmp_path):
    """Every field of the think grammar can be declared: ``tools_in_think`` (Qwen3.5's calls may
    open inside the reasoning) was missing from the TOML schema, so a declared Qwen3.5 variant
    was refused as an unknown key."""
    p = tmp_path / "q35.toml"
    p.write_text(
        'name = "qwen3.5-house"\nversion = "1"\nbase = "qwen3.5"\n'
        '[think]\nopen = "think_open"\nclose = "think_close"\nopen_suffix = "\\n"\n'
        'close_prefix = "\\n"\nclose_suffix = "\\n\\n"\nprompt_opens = true\ntools_in_think = true\n'
    )
    fmt = get_format(str(p))
    assert fmt.think is not None and fmt.think.tools_in_think
    assert fmt.think == get_format("qwen3.5").think
