"""No control id from any text, in every format: every control string of a format's tokenizer,
written into every text field a conversation has (system, user, assistant content and reasoning,
tool names, descriptions and parameter schemas, tool-call arguments, tool results), leaves the
control ids of the rendering exactly where the format puts its markers."""

from __future__ import annotations

import json

import pytest

from draftdata.records import Message, ToolCall
from draftdata.tokens.target import Target

FORMATS = ["smollm2", "llama3", "qwen3", "qwen3.5", "deepseek-v3", "kimi-k2"]
#: formats whose prompt opens the think block, on a vocabulary of conftest.REAL's: format name
#: -> the tokenizer's key there
OPENING = {"qwen3-thinking": "qwen3", "deepseek-r1": "deepseek-v4", "deepseek-v3.1": "deepseek-v4"}


def tools(x: str) -> list[dict]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"lookup{x}",
                "description": f"Find a word {x} in the dictionary.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        f"word{x}": {"type": "string", "description": f"the word {x}"},
                        "lang": {"type": "string", "enum": ["en", f"x{x}"]},
                    },
                    "required": [f"word{x}"],
                },
            },
        }
    ]


def conversation(x: str, kimi: bool, calls: bool) -> list[Message]:
    call_id = f"functions.lookup{x}:0" if kimi else "call_0"
    call = (ToolCall(f"lookup{x}", json.dumps({f"word{x}": x}), call_id),) if calls else ()
    return [
        Message("system", f"You help {x} with words."),
        Message("user", f"What does {x} mean?"),
        Message(
            "assistant",
            f"Let me look {x} up.",
            reasoning=f"I should call the tool {x} first.",
            tool_calls=call,
        ),
        *([Message("tool", f"a word {x} from a list", tool_call_id=call_id)] if calls else []),
        Message("user", f"Thanks {x}, and again?"),
    ]


def control_ids(ids: list[int], control: frozenset[int]) -> list[int]:
    return [i for i in ids if i in control]


@pytest.mark.parametrize("key", [*FORMATS, *OPENING])
def test_control_strings_in_every_text_field_stay_text(bound, load, key):
    from draftdata.formats import get_format

    b = get_format(key).bind(load(OPENING[key])) if key in OPENING else bound(key)
    tok, fmt = b.tokenizer, b.format
    history_calls = fmt.has_tool_grammar
    strings = sorted({t.text for t in tok.control_tokens.values() if t.text})
    assert strings, key
    # mid-sentence, so no field starts or ends with a marker's text
    x = " (" + " ".join(strings) + ") "
    kimi = key == "kimi-k2"
    think = {"thinking": True} if fmt.think is not None else {}

    def render(text: str) -> tuple[list[int], list[int]]:
        ts = tools(text) if getattr(fmt, "supports_tools", fmt.has_tool_grammar) else []
        prompt, _ = Target(b).encode(
            fmt.render_prompt(conversation(text, kimi, history_calls), ts, **think)
        )
        calls = (ToolCall(f"lookup{text}", json.dumps({f"word{text}": text}), None),)
        response, _ = Target(b).encode(
            fmt.render_response(
                content=f"Here {text} it is.",
                reasoning=f"Thinking {text} about it." if fmt.think is not None else None,
                tool_calls=calls if fmt.has_tool_grammar else (),
                finished=True,
                thinking=fmt.think is not None,
            )
        )
        return prompt, response

    plain_prompt, plain_response = render(" plain ")
    prompt, response = render(x)
    control = tok.control_ids
    assert control_ids(prompt, control) == control_ids(plain_prompt, control), key
    assert control_ids(response, control) == control_ids(plain_response, control), key
    # and the strings are all there, as text
    assert tok.decode(prompt).count(x.strip()) >= 1
