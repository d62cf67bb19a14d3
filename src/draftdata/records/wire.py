"""The OpenAI wire format, both ways: what OpenAI-compatible APIs return, in every provider
shape, parsed into typed records; and records written back as request messages. Also the
ground-truth JSONL schema, which holds messages in this format."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InputError
from . import ApiView, Decoding, GroundTruth, LogprobToken, Message, Role, ToolCall, Usage

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


#: ids a server sends are stored as int32
ID_LIMIT = 2**31
#: token counts a server sends are stored as SQLite integers (int64); anything near that is absurd
COUNT_LIMIT = 2**53
#: a finish reason is a short word; anything longer is not one
FINISH_LIMIT = 64


def _text(value: Any, what: str) -> str | None:
    """``value`` where it is text or null; InputError naming ``what`` otherwise."""
    if value is None or isinstance(value, str):
        return value
    raise InputError(f"{what} is a {type(value).__name__}, not text")


def reasoning_of(msg: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(reasoning text, field it came from). ``reasoning_details`` joins its
    ``reasoning.text`` entries (OpenRouter); encrypted or summary entries carry no raw text.
    A reasoning field that holds something other than text raises InputError: dropping it
    would rebuild the answer without its reasoning."""
    for key in REASONING_FIELDS:
        val = msg.get(key)
        if val is None:
            continue
        if key == "reasoning_details":
            if not isinstance(val, list):
                raise InputError(f"reasoning_details is a {type(val).__name__}, not a list")
            texts = [
                _text(d.get("text"), "a reasoning_details text") or ""
                for d in val
                if isinstance(d, dict) and d.get("type") == "reasoning.text"
            ]
            if not texts:
                continue
            return "".join(texts), key
        return _text(val, key), key
    return None, None


def tool_calls_of(raw: Any) -> tuple[ToolCall, ...]:
    """A message's ``tool_calls``: a list of calls, each with a ``function`` object whose
    ``name`` is text and whose ``arguments`` is text (an object is kept as its JSON text, as
    some providers send it). Any other shape raises InputError."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise InputError(f"tool_calls is a {type(raw).__name__}, not a list")
    out = []
    for i, tc in enumerate(raw):
        fn = tc.get("function") if isinstance(tc, Mapping) else None
        if not isinstance(fn, Mapping):
            raise InputError(f"tool call {i} has no function object")
        args = fn.get("arguments", "")
        if isinstance(args, (dict, list)):  # some providers send an object; keep it as JSON text
            args = json.dumps(args, ensure_ascii=False)
        cid = tc.get("id")
        out.append(
            ToolCall(
                name=_text(fn.get("name"), f"tool call {i}'s name") or "",
                arguments=_text(args, f"tool call {i}'s arguments") or "",
                id=None if cid is None else str(cid) if isinstance(cid, (str, int)) else None,
                type=_text(tc.get("type"), f"tool call {i}'s type") or "function",
            )
        )
    return tuple(out)


def logprobs_of(raw: Any) -> tuple[LogprobToken, ...] | None:
    """``logprobs.content`` as tokens; None where it is absent or not in OpenAI's shape (the
    answer is then read from its text)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("content"), list):
        return None
    out = []
    for e in raw["content"]:
        if not isinstance(e, Mapping) or not isinstance(e.get("token"), str):
            return None
        tok = e["token"]
        m = _TOKEN_ID.match(tok)
        b = e.get("bytes")
        ok_bytes = isinstance(b, list) and all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 256 for x in b
        )
        tid = int(m.group(1)) if m and len(m.group(1)) < 11 else None
        out.append(
            LogprobToken(
                tok,
                tuple(b) if ok_bytes and isinstance(b, list) else None,
                tid if tid is not None and tid < ID_LIMIT else None,
            )
        )
    return tuple(out)


def finish_of(raw: Any) -> str:
    """A choice's ``finish_reason``: short text, or "stop" where absent; InputError otherwise."""
    if raw is None or raw == "":
        return "stop"
    if not isinstance(raw, str) or len(raw) > FINISH_LIMIT or not raw.isprintable():
        shown = type(raw).__name__ if not isinstance(raw, str) else f"{len(raw)} characters"
        raise InputError(f"finish_reason is not a short word ({shown})")
    return raw


def content_of(content: Any) -> str | None:
    """A message's content: text, null, or a list of text parts joined."""
    if isinstance(content, list):  # content parts
        return "".join(
            _text(p.get("text"), "a content part's text") or ""
            for p in content
            if isinstance(p, Mapping)
        )
    return _text(content, "content")


def view_from_message(
    msg: Mapping[str, Any], finish_reason: str | None, logprobs: Any = None
) -> ApiView:
    """An answer's message as a view. Every field is checked for its type: InputError names
    the first that is not what the wire format says (text, a list of calls, ...)."""
    if not isinstance(msg, Mapping):
        raise InputError(f"the message is a {type(msg).__name__}, not an object")
    reasoning, source = reasoning_of(msg)
    return ApiView(
        content=content_of(msg.get("content")),
        finish_reason=finish_of(finish_reason),
        reasoning=reasoning,
        tool_calls=tool_calls_of(msg.get("tool_calls")),
        logprobs=logprobs_of(logprobs),
        reasoning_field=source,
    )


def view_from_record(rec: Mapping[str, Any]) -> ApiView | None:
    """The API answer held by an input record: ``api_view`` (ground-truth schema), a raw
    chat-completion ``response``, or the record itself when it is a chat completion.
    InputError where a field is not of its type."""
    if isinstance(rec.get("api_view"), Mapping):
        v = rec["api_view"]
        view = view_from_message(v, v.get("finish_reason"), v.get("logprobs"))
        return replace(view, usage=counted_usage(rec.get("usage")))
    resp = rec["response"] if isinstance(rec.get("response"), Mapping) else rec
    choices = resp.get("choices")
    if isinstance(choices, list) and choices:
        ch = choices[0]
        if not isinstance(ch, Mapping):
            raise InputError(f"choices[0] is a {type(ch).__name__}, not an object")
        view = view_from_message(
            ch.get("message") or {}, ch.get("finish_reason"), ch.get("logprobs")
        )
        return replace(view, server=detect_server(resp), usage=counted_usage(resp.get("usage")))
    return None


def counted_usage(raw: Any) -> Usage | None:
    """``usage`` as the count witness reads it: None where it holds no count to check (absent,
    or no valid prompt or completion count)."""
    return _counted(usage_of(raw)[0])


def _counted(usage: Usage) -> Usage | None:
    return None if usage.prompt_tokens is None and usage.completion_tokens is None else usage


@dataclass(frozen=True)
class WireAnswer:
    """A chat-completion body as the wire boundary read it: every field the rest of draftdata
    uses, each checked for type and bounds. ``problem`` says why a paid-for answer cannot be
    used (it is stored verbatim and quarantined); ``usage`` holds only the values that are
    finite, non-negative counts and costs, and ``usage_invalid`` names the ones that were not."""

    data: dict[str, Any]
    finish_reason: str
    view: ApiView
    output_ids: tuple[int, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    usage: Usage = field(default_factory=Usage)
    usage_invalid: tuple[str, ...] = ()
    problem: str | None = None


def bounded_ids(raw: Any, what: str) -> tuple[int, ...]:
    """A list of ints that fit the ledger's int32 ids; InputError otherwise. Whether each is in
    the vocabulary is the tokens stage's check (``id_out_of_vocabulary``)."""
    if not isinstance(raw, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and -ID_LIMIT <= i < ID_LIMIT for i in raw
    ):
        raise InputError(f"{what} is not a list of int32 token ids")
    return tuple(raw)


def usage_of(raw: Any) -> tuple[Usage, tuple[str, ...]]:
    """``usage``: the counts and cost that are finite and non-negative (within what is
    stored); the names of those that were present but not."""
    if not isinstance(raw, Mapping):
        return Usage(), ("usage",) if raw is not None else ()
    bad: list[str] = []

    def count(name: str, within: Mapping[str, Any] = raw) -> int | None:
        v = within.get(name)
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < COUNT_LIMIT:
            return v
        bad.append(name)
        return None

    pt, ct = count("prompt_tokens"), count("completion_tokens")
    details = raw.get("completion_tokens_details")
    rt = count("reasoning_tokens", details) if isinstance(details, Mapping) else None
    cost = raw.get("cost")
    if cost is not None:
        ok = (
            isinstance(cost, (int, float))
            and not isinstance(cost, bool)
            and math.isfinite(cost)
            and 0 <= cost < COUNT_LIMIT
        )
        if not ok:
            bad.append("cost")
        cost = float(cost) if ok else None
    return Usage(pt, ct, cost, rt), tuple(bad)


def parse_answer(text: str, *, want_ids: bool, server: str | None = None) -> WireAnswer | str:
    """A 200 body as a WireAnswer, or the reason to ask again (``http_200_invalid_json``,
    ``no_choices``): the one place a server's answer is read. Ids are read only where they
    were asked for (``want_ids``). An answer that arrived but cannot be used is a WireAnswer
    with its ``problem``: nesting too deep to read, a message that is not an object, content
    or reasoning that is not text, a finish reason that is not a short word, ids outside the
    int32 range."""
    try:
        data = json.loads(text)
    except RecursionError:
        return WireAnswer({}, "stop", ApiView(None, "stop"), problem="too_deep: nesting too deep")
    except ValueError:
        return "http_200_invalid_json"
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "no_choices"
    ch = choices[0]
    usage, invalid = usage_of(data.get("usage"))
    try:
        finish = finish_of(ch.get("finish_reason"))
    except InputError as e:
        view = ApiView(None, "stop")
        return WireAnswer(data, "stop", view, None, None, usage, invalid, f"bad_finish: {e}")
    try:
        msg = ch.get("message")
        if msg is None:
            msg = {}
        view = view_from_message(msg, finish, ch.get("logprobs"))
        view = replace(
            view,
            server=server if server is not None else detect_server(data),
            usage=_counted(usage),
        )
        field = ids_field(ch) if want_ids else None
        out = bounded_ids(ch[field], field) if field else None
        prompt = prompt_ids_of(data, ch) if want_ids else None
        prompt_ids = bounded_ids(prompt, "prompt_token_ids") if prompt is not None else None
    except InputError as e:
        view = ApiView(None, finish)
        return WireAnswer(data, finish, view, None, None, usage, invalid, f"unusable_message: {e}")
    except RecursionError:
        view = ApiView(None, finish)
        return WireAnswer(data, finish, view, None, None, usage, invalid, "too_deep: nesting")
    return WireAnswer(data, finish, view, out, prompt_ids, usage, invalid)


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
        field = ids_field(choice)
        output = choice.get(field) if field else None
    if output is None:
        raise InputError("record has no output_ids (nor choices[0].token_ids)")
    prompt = rec.get("prompt_ids")
    if prompt is None:
        prompt = prompt_ids_of(resp, choice if isinstance(choice, Mapping) else {})
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
    field = ids_field(ch) if isinstance(ch, Mapping) else None
    out = ch.get(field) if isinstance(ch, Mapping) and field else None
    prompt = prompt_ids_of(resp, ch if isinstance(ch, Mapping) else {})

    def ints(v: Any) -> tuple[int, ...] | None:
        ok = isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        return tuple(v) if ok else None

    out_ids = ints(out)
    return out_ids, ints(prompt) if out_ids is not None else None


#: where a choice carries the model's answer ids when ``return_token_ids`` was asked: vLLM's
#: name, then SGLang's (0.5: ``ChatCompletionResponseChoice.response_token_ids``)
IDS_FIELDS = ("token_ids", "response_token_ids")


def ids_field(choice: Mapping[str, Any]) -> str | None:
    """The field of ``choice`` that holds answer ids (present and not null), if any."""
    return next((f for f in IDS_FIELDS if choice.get(f) is not None), None)


def ids_returned(response: Mapping[str, Any]) -> bool:
    """Whether a chat-completion body's first choice carries the answer's ids (vLLM's field or
    SGLang's), as ``parse_answer`` reads them."""
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, Mapping):
        return False
    name = ids_field(choice)
    return name is not None and isinstance(choice.get(name), list)


def prompt_ids_of(response: Mapping[str, Any], choice: Mapping[str, Any]) -> Any:
    """The prompt ids a response reports: top level (vLLM) or in the choice (SGLang)."""
    got = response.get("prompt_token_ids")
    return got if got is not None else choice.get("prompt_token_ids")


def detect_server(response: Mapping[str, Any]) -> str | None:
    """The server a raw chat-completion response came from, where its fields say it: vLLM
    writes ``stop_reason`` (and ``token_ids`` when asked) in each choice, SGLang
    ``matched_stop``, OpenRouter a top-level ``provider``."""
    if isinstance(response.get("provider"), str):
        return "openrouter"
    choices = response.get("choices")
    ch = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(ch, Mapping):
        if "matched_stop" in ch or "response_token_ids" in ch:
            return "sglang"
        if "stop_reason" in ch or "token_ids" in ch:
            return "vllm"
    return None
