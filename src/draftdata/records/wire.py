"""The OpenAI wire format, both ways: what OpenAI-compatible APIs return, in every provider
shape, parsed into typed records; and records written back as request messages. Also the
ground-truth JSONL schema, which holds messages in this format."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import InputError
from . import ApiView, Decoding, GroundTruth, LogprobToken, Message, Role, ToolCall

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
        view = view_from_message(
            ch.get("message") or {}, ch.get("finish_reason"), ch.get("logprobs")
        )
        return replace(view, server=detect_server(resp))
    return None


def messages_of(raw: Sequence[Any]) -> tuple[Message, ...]:
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            raise InputError(f"message {i} has no valid role (system/user/assistant/tool)")
        role: Role = _ROLE_MAP[m["role"]]
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text") or "" for p in content if isinstance(p, Mapping))
        if content is not None and not isinstance(content, str):
            raise InputError(
                f"message {i} content is a {type(content).__name__}; it must be text, a list "
                "of text parts, or null"
            )
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


def message_to_wire(m: Message, *, reasoning: bool = False) -> dict[str, Any]:
    """One message as an OpenAI chat message. ``reasoning`` adds ``reasoning_content`` (what
    vLLM, SGLang and trainers such as SpecForge read); requests to an API leave it out."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if reasoning and m.reasoning:
        d["reasoning_content"] = m.reasoning
    if m.tool_calls:
        d["tool_calls"] = [
            {
                "id": c.id or f"call_{i}",
                "type": c.type,
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(m.tool_calls)
        ]
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    if m.name:
        d["name"] = m.name
    return d


def messages_to_wire(msgs: Sequence[Message], *, reasoning: bool = False) -> list[dict[str, Any]]:
    return [message_to_wire(m, reasoning=reasoning) for m in msgs]


_SAMPLE_SUFFIX = re.compile(r"-(greedy|sample)(-\d+)?$")


def _ids(raw: Any, what: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in raw
    ):
        raise InputError(f"{what} must be a list of integer ids")
    return tuple(raw)


def ground_truth_of(rec: Mapping[str, Any], index: int = 0) -> GroundTruth:
    """A ground-truth record (see ../shared/data/groundtruth/README.md): messages, prompt_ids,
    output_ids, finish_reason, and the server's view (``api_view``) or a raw ``response`` where
    present. An unusable record raises InputError naming what is wrong (callers count it)."""
    if not isinstance(rec.get("messages"), list):
        raise InputError("record has no messages list")
    rid = str(rec.get("id", index))
    # a raw vLLM response (return_token_ids) carries the ids itself
    resp = rec["response"] if isinstance(rec.get("response"), Mapping) else rec
    choices = resp.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    output = rec.get("output_ids")
    if output is None and isinstance(choice, Mapping):
        output = choice.get("token_ids")
    if output is None:
        raise InputError("record has no output_ids (nor choices[0].token_ids)")
    prompt = rec.get("prompt_ids")
    if prompt is None:
        prompt = resp.get("prompt_token_ids")
    tools = rec.get("tools") or ()
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
        raise InputError("tools must be a list of JSON objects")
    return GroundTruth(
        id=rid,
        messages=messages_of(rec["messages"]),
        prompt_ids=_ids(prompt, "prompt_ids") if prompt is not None else None,
        output_ids=_ids(output, "output_ids"),
        finish_reason=str(
            rec.get("finish_reason")
            or (choice.get("finish_reason") if isinstance(choice, Mapping) else None)
            or "stop"
        ),
        tools=tuple(dict(t) for t in tools),
        group=str(rec.get("group") or _SAMPLE_SUFFIX.sub("", rid)),
        source=str(rec.get("source") or rec.get("dataset") or "all"),
        view=view_from_record(rec),
        decoding=decoding_of(rec.get("sampling")),
    )


def decoding_of(sampling: Any) -> Decoding:
    """The ground truth's ``sampling`` field (``{"greedy": true}`` or ``{"temperature": T,
    "top_p": P}``) as a Decoding; anything else is unknown."""
    if not isinstance(sampling, Mapping):
        return Decoding()
    if sampling.get("greedy") is True:
        return Decoding(0.0)
    t, p = sampling.get("temperature"), sampling.get("top_p", 1.0)
    if isinstance(t, (int, float)) and isinstance(p, (int, float)) and t >= 0 and 0 < p <= 1:
        return Decoding(float(t), float(p))
    return Decoding()


def raw_ids(rec: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(answer ids, prompt ids) a raw chat-completion response carries (vLLM with
    ``return_token_ids``: ``choices[0].token_ids``, ``prompt_token_ids``), where they are lists
    of ints; (None, None) otherwise."""
    resp = rec["response"] if isinstance(rec.get("response"), Mapping) else rec
    choices = resp.get("choices")
    ch = choices[0] if isinstance(choices, list) and choices else None
    out = ch.get("token_ids") if isinstance(ch, Mapping) else None
    prompt = resp.get("prompt_token_ids")

    def ints(v: Any) -> tuple[int, ...] | None:
        ok = isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        return tuple(v) if ok else None

    out_ids = ints(out)
    return out_ids, ints(prompt) if out_ids is not None else None


def detect_server(response: Mapping[str, Any]) -> str | None:
    """The server a raw chat-completion response came from, where its fields say it: vLLM
    writes ``stop_reason`` (and ``token_ids`` when asked) in each choice, SGLang
    ``matched_stop``, OpenRouter a top-level ``provider``."""
    if isinstance(response.get("provider"), str):
        return "openrouter"
    choices = response.get("choices")
    ch = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(ch, Mapping):
        if "matched_stop" in ch:
            return "sglang"
        if "stop_reason" in ch or "token_ids" in ch:
            return "vllm"
    return None
