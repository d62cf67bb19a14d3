"""Conversations shared by the format tests, as draftdata records and as template dicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftdata.records import Message, ToolCall


def bfcl_tools(path: Path, n: int = 2) -> tuple[list[dict[str, Any]], str]:
    """The first BFCL record's function schemas as OpenAI tools ("dict" -> "object")."""

    def norm(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: ("object" if k == "type" and v == "dict" else norm(v)) for k, v in x.items()}
        if isinstance(x, list):
            return [norm(v) for v in x]
        return x

    rec = json.loads(path.read_text().splitlines()[0])
    tools = [{"type": "function", "function": norm(f)} for f in rec["function"][:n]]
    return tools, rec["question"][0][0]["content"]


def to_template(messages: list[Message], args_as_object: bool = False) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        content = m.content if m.content is not None or m.tool_calls else ""
        d: dict[str, Any] = {"role": m.role, "content": content}
        if m.reasoning is not None:
            d["reasoning_content"] = m.reasoning
        if m.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {
                        "name": c.name,
                        "arguments": json.loads(c.arguments) if args_as_object else c.arguments,
                    },
                }
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


SYSTEM_USER = [
    Message("system", "You are a terse assistant."),
    Message("user", "What is the capital of France?"),
]

MULTI_TURN = [
    Message("system", "You are a helpful assistant."),
    Message("user", "Name a prime number."),
    Message("assistant", "7 is a prime number.", reasoning="The user wants any prime."),
    Message("user", "  And an even one?\n"),
]

MULTI_TURN_NO_SYSTEM = [m for m in MULTI_TURN if m.role != "system"]


def tool_conversation(question: str, kimi_ids: bool = False) -> list[Message]:
    ids = (
        ["functions.triangle_properties.get:0", "functions.circle_properties.get:1"]
        if kimi_ids
        else ["call_0", "call_1"]
    )
    return [
        Message("system", "Use the tools when they help."),
        Message("user", question),
        Message(
            "assistant",
            "",
            tool_calls=(
                ToolCall("triangle_properties.get", '{"side1": 5, "side2": 4, "side3": 3}', ids[0]),
                ToolCall("circle_properties.get", '{"radius": 2.5, "get_area": true}', ids[1]),
            ),
        ),
        Message("tool", '{"area": 6.0, "perimeter": 12}', tool_call_id=ids[0]),
        Message("tool", '{"area": 19.63}', tool_call_id=ids[1]),
    ]


def special_strings_user(marker_texts: list[str]) -> list[Message]:
    text = "Please repeat these literally: " + " and ".join(marker_texts) + " <|endoftext|> done."
    return [Message("system", "Echo what the user says."), Message("user", text)]
