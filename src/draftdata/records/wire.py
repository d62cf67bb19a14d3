"""Parse what OpenAI-compatible APIs return, in every provider shape, into typed records."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InputError
from . import ApiView, LogprobToken, Message, Role, ToolCall

#: provider fields that carry reasoning text, in the order they are trusted
REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_details")
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_ROLE_MAP: dict[str, Role] = {
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "developer": "system",
    "function": "tool",
}
_ROLES = set(_ROLE_MAP)


def reasoning_of(msg: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(reasoning text, field it came from). ``reasoning_details`` joins its
    ``reasoning.text`` entries (OpenRouter); encrypted or summary entries carry no raw text."""
    for key in REASONING_FIELDS:
        val = msg.get(key)
        if val is None:
            continue
        if key == "reasoning_details":
            if not isinstance(val, list):
                continue
            texts = [
                d.get("text") or ""
                for d in val
                if isinstance(d, dict) and d.get("type") == "reasoning.text"
            ]
            if not texts:
                continue
            return "".join(texts), key
        if isinstance(val, str):
            return val, key
    return None, None


def tool_calls_of(raw: Any) -> tuple[ToolCall, ...]:
    if not raw:
        return ()
    out = []
    for tc in raw:
        fn = tc.get("function") or {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):  # some providers send an object; keep it as JSON text
            args = json.dumps(args, ensure_ascii=False)
        out.append(
            ToolCall(
                name=str(fn.get("name", "")),
                arguments=args,
                id=tc.get("id"),
                type=str(tc.get("type") or "function"),
            )
        )
    return tuple(out)


def logprobs_of(raw: Any) -> tuple[LogprobToken, ...] | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("content"), list):
        return None
    out = []
    for e in raw["content"]:
        tok = str(e.get("token", ""))
        m = _TOKEN_ID.match(tok)
        b = e.get("bytes")
        out.append(
            LogprobToken(
                tok, tuple(b) if isinstance(b, list) else None, int(m.group(1)) if m else None
            )
        )
    return tuple(out)


def view_from_message(
    msg: Mapping[str, Any], finish_reason: str | None, logprobs: Any = None
) -> ApiView:
    reasoning, field = reasoning_of(msg)
    content = msg.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ApiView(
        content=content,
        finish_reason=finish_reason or "stop",
        reasoning=reasoning,
        tool_calls=tool_calls_of(msg.get("tool_calls")),
        logprobs=logprobs_of(logprobs),
        reasoning_field=field,
    )


def view_from_record(rec: Mapping[str, Any]) -> ApiView | None:
    """The API answer held by an input record: ``api_view`` (ground-truth schema), a raw
    chat-completion ``response``, or the record itself when it is a chat completion."""
    if isinstance(rec.get("api_view"), Mapping):
        v = rec["api_view"]
        return view_from_message(v, v.get("finish_reason"), v.get("logprobs"))
    resp = rec["response"] if isinstance(rec.get("response"), Mapping) else rec
    choices = resp.get("choices")
    if isinstance(choices, list) and choices:
        ch = choices[0]
        return view_from_message(
            ch.get("message") or {}, ch.get("finish_reason"), ch.get("logprobs")
        )
    return None


def messages_of(raw: Sequence[Any]) -> tuple[Message, ...]:
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            raise InputError(f"message {i} has no valid role (system/user/assistant/tool)")
        role: Role = _ROLE_MAP[m["role"]]
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        reasoning, _ = reasoning_of(m)
        out.append(
            Message(
                role=role,
                content=content,
                reasoning=reasoning,
                tool_calls=tool_calls_of(m.get("tool_calls")),
                tool_call_id=m.get("tool_call_id"),
                name=m.get("name"),
            )
        )
    return tuple(out)
