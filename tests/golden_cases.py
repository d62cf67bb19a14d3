"""Reconstruction cases for the golden files: one generation, expressed in every shape an API
returns reasoning in. ``make_golden.py`` writes tests/golden/*.json from these with the real
tokenizers; test_reconstruct_golden.py checks them against the models' own chat templates."""

from __future__ import annotations

from typing import Any

REASONING = "The user asks for 17 * 3. 17 * 3 = 51. I should answer briefly."
CONTENT = "17 × 3 = **51**."
CALLS = [
    {
        "id": "call_0",
        "type": "function",
        "function": {
            "name": "triangle_properties.get",
            "arguments": '{"side1": 5, "side2": 4, "side3": 3}',
        },
    },
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "circle_properties.get", "arguments": '{"radius": 2.5}'},
    },
]
KIMI_CALLS = [dict(c, id=f"functions.{c['function']['name']}:{i}") for i, c in enumerate(CALLS)]
USER = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 17 * 3?"},
]
MULTI = [
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is 17 * 3?"},
]
TOOL_USER = [{"role": "user", "content": "Triangle 5/4/3 and a circle of radius 2.5, please."}]


def shapes(
    reasoning: str | None,
    content: str | None,
    tool_calls: list[dict[str, Any]] | None,
    finish: str,
    open_t: str = "<think>",
    close_t: str = "</think>",
    prompt_opens: bool = False,
    ws: tuple[str, str, str] = ("\n", "\n", "\n\n"),
) -> dict[str, dict[str, Any]]:
    """The same answer as `reasoning_content`, `reasoning`, `reasoning_details[]` and think tags
    inline in `content`, each a raw chat-completion response."""

    def resp(msg: dict[str, Any]) -> dict[str, Any]:
        msg = {"role": "assistant", **msg}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
        }

    out = {
        "reasoning_content": resp({"content": content, "reasoning_content": reasoning}),
        "reasoning": resp({"content": content, "reasoning": reasoning}),
        "reasoning_details": resp(
            {
                "content": content,
                "reasoning_details": [
                    {"type": "reasoning.text", "text": reasoning, "format": "unknown", "index": 0}
                ],
            }
        ),
    }
    if reasoning is not None and close_t not in reasoning:  # else inline tags are ambiguous
        inline = ("" if prompt_opens else open_t + ws[0]) + reasoning + ws[1] + close_t + ws[2]
        out["inline_think_tags"] = resp({"content": inline + (content or "")})
    return out


CASES: dict[str, list[dict[str, Any]]] = {
    # format key -> cases
    fmt: [
        {
            "name": "reasoning_and_content",
            "messages": USER,
            "finish": "stop",
            "reasoning": REASONING,
            "content": CONTENT,
            "tool_calls": None,
            "template": True,
        },
        {
            "name": "reasoning_and_tool_calls",
            "messages": TOOL_USER,
            "finish": "tool_calls",
            "reasoning": "Two shapes, two calls.",
            "content": "",
            "tool_calls": KIMI_CALLS if fmt == "kimi-k2" else CALLS,
            "template": True,
            "tools": True,
        },
        {
            "name": "multi_turn",
            "messages": MULTI,
            "finish": "stop",
            "reasoning": REASONING,
            "content": CONTENT,
            "tool_calls": None,
            "template": True,
        },
        {
            "name": "truncated",
            "messages": USER,
            "finish": "length",
            "reasoning": REASONING,
            "content": "17 × 3 is",
            "tool_calls": None,
            "template": False,
        },
        {
            "name": "special_strings_in_content",
            "messages": USER,
            "finish": "stop",
            "reasoning": "Echo <|im_end|> and </think> as text.",
            "content": "Literal: <|im_end|> <think> <|im_start|> <tool_call> <｜end▁of▁sentence｜>",
            "tool_calls": None,
            "template": True,
        },
        {
            "name": "empty_reasoning",
            "messages": USER,
            "finish": "stop",
            "reasoning": None,
            "content": CONTENT,
            "tool_calls": None,
            "template": fmt != "kimi-k2",
        },
    ]
    for fmt in ("kimi-k2", "qwen3", "qwen3.5", "deepseek-v4")
}
for _case in CASES["deepseek-v4"]:  # the V4 package ships no chat template to compare with
    _case["template"] = False
# DeepSeek V3's own template renders tool calls (content None, 2 calls) but no reasoning
CASES["deepseek-v3"] = [
    {
        "name": "tool_calls",
        "messages": TOOL_USER,
        "finish": "tool_calls",
        "reasoning": None,
        "content": None,
        "tool_calls": CALLS,
        "template": True,
    },
    {
        "name": "content",
        "messages": USER,
        "finish": "stop",
        "reasoning": None,
        "content": CONTENT + " <｜User｜> stays text",
        "tool_calls": None,
        "template": True,
    },
]
