"""Readers for datasets in their native formats: ShareGPT, HumanEval, BFCL, WritingBench,
Glaive function-calling, Magicoder, UltraChat, and Parquet / HF ``save_to_disk`` folders.

Every reader streams records, turns each into a ``Prompt`` (id = content hash), keeps the whole
conversation, and counts each skipped record under one specific reason. Tool schemas come out in
OpenAI tool format (``{"type": "function", "function": {...}}``); tool-call arguments are JSON
text, kept verbatim where the dataset gives text. A missing or unreadable file raises
``InputError``; a bad record never does."""

from __future__ import annotations

import json
import re
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..nesting import loads_json
from ..records import Message, Prompt, Role, ToolCall
from ..records.wire import messages_of
from .base import iter_json_records, make_prompt, reader
from .common import Skip, _text, _with_user, function_tool, tools_of

#: HumanEval's instruction, as the ground-truth generations used it (groundtruth/README.md)
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Return only code.\n\n"
#: BFCL's non-JSON-Schema type names and their JSON Schema equivalents
BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}

_SHAREGPT_ROLES: dict[str, Role] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
}


# --- shared pieces -----------------------------------------------------------------------------


def _field(rec: Mapping[str, Any], key: str, reason: str) -> str:
    value = rec.get(key)
    if not isinstance(value, str) or not value.strip():
        raise Skip(reason)
    return value


def json_schema(node: Any) -> Any:
    """A BFCL parameter schema as JSON Schema: ``dict``/``float``/``tuple``/``any`` become
    ``object``/``number``/``array``/``string`` at every level. Only schema positions are
    rewritten (a property *named* ``type`` is left alone); every other key is kept."""
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type":
            if isinstance(value, str):
                value = BFCL_TYPES.get(value, value)
            elif isinstance(value, list):
                value = [BFCL_TYPES.get(v, v) if isinstance(v, str) else v for v in value]
        elif key in ("properties", "patternProperties", "$defs", "definitions"):
            if isinstance(value, Mapping):
                value = {k: json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "contains"):
            value = (
                [json_schema(v) for v in value] if isinstance(value, list) else json_schema(value)
            )
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            value = [json_schema(v) for v in value]
        out[key] = value
    return out


def arguments_text(args: Any) -> str:
    """Tool-call arguments as JSON text: a string is kept verbatim (it must parse as JSON),
    an object is serialised."""
    if isinstance(args, str):
        try:
            loads_json(args)
        except ValueError:
            raise Skip("bad_function_call") from None
        return args
    if isinstance(args, (dict, list)):
        return json.dumps(args, ensure_ascii=False)
    raise Skip("bad_function_call")


class CallLinker:
    """Gives tool calls stable ids (``call_0``, ``call_1``, ... per conversation) and links each
    tool result to the oldest call still waiting for one."""

    def __init__(self) -> None:
        self.n = 0
        self.pending: deque[ToolCall] = deque()

    def call(self, name: Any, args: Any) -> ToolCall:
        if not isinstance(name, str) or not name:
            raise Skip("bad_function_call")
        tc = ToolCall(name, arguments_text(args), id=f"call_{self.n}")
        self.n += 1
        self.pending.append(tc)
        return tc

    def result(self, content: str) -> Message:
        tc = self.pending.popleft() if self.pending else None
        return Message(
            "tool", content, tool_call_id=tc.id if tc else None, name=tc.name if tc else None
        )

    def user_turn(self) -> None:
        self.pending.clear()  # calls a user turn interrupts get no later result


def _records(
    path: Path, counter: Counter[str], build: Callable[[Mapping[str, Any]], Prompt]
) -> Iterator[Prompt]:
    """``build`` over every JSON record; a record it raises ``Skip`` for is counted."""
    for rec in iter_json_records(path, counter):
        try:
            yield build(rec)
        except Skip as s:
            counter[s.reason] += 1


def _meta(rec: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: rec[k] for k in keys if rec.get(k) is not None}


# --- ShareGPT ----------------------------------------------------------------------------------


def sharegpt_messages(turns: Any, system: Any = None) -> tuple[Message, ...]:
    """ShareGPT ``conversations[{from, value}]`` as messages; ``function_call`` turns become
    assistant tool calls (value: ``{"name", "arguments"}`` or a list of them)."""
    if not isinstance(turns, list) or not turns:
        raise Skip("no_conversations")
    msgs: list[Message] = []
    if isinstance(system, str) and system.strip():
        first = turns[0].get("from") if isinstance(turns[0], Mapping) else None
        if first != "system":
            msgs.append(Message("system", system))
    calls = CallLinker()
    for t in turns:
        if not isinstance(t, Mapping) or not isinstance(t.get("from"), str):
            raise Skip("bad_turn")
        who, value = t["from"].lower(), _text(t.get("value"))
        if who == "function_call":
            try:
                doc = loads_json(value)
            except ValueError:
                raise Skip("bad_function_call") from None
            docs = doc if isinstance(doc, list) else [doc]
            if not docs or not all(isinstance(d, Mapping) for d in docs):
                raise Skip("bad_function_call")
            tcs = tuple(calls.call(d.get("name"), d.get("arguments")) for d in docs)
            msgs.append(Message("assistant", None, tool_calls=tcs))
            continue
        role = _SHAREGPT_ROLES.get(who)
        if role is None:
            raise Skip("unknown_role")
        if role == "tool":
            msgs.append(calls.result(value))
            continue
        if role == "user":
            calls.user_turn()
        msgs.append(Message(role, value))
    return _with_user(msgs)


@reader("sharegpt")
def read_sharegpt(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """ShareGPT / FastChat conversations (JSON array or JSONL): ``conversations[{from, value}]``
    with optional record-level ``system`` and ``tools``. The whole conversation is kept."""
    conv_key = columns.get("conversations", "conversations")
    sys_key = columns.get("system", "system")
    tools_key = columns.get("tools", "tools")

    def build(rec: Mapping[str, Any]) -> Prompt:
        msgs = sharegpt_messages(rec.get(conv_key), rec.get(sys_key))
        return make_prompt(dataset, msgs, tools_of(rec.get(tools_key)), **_meta(rec, "id"))

    return _records(path, counter, build)


# --- single-prompt benchmarks ------------------------------------------------------------------


@reader("humaneval")
def read_humaneval(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """HumanEval (JSONL, ``.gz`` too): the instruction (``columns.instruction``, default
    ``HUMANEVAL_INSTRUCTION``) followed by the task ``prompt`` as one user message."""
    instruction = columns.get("instruction", HUMANEVAL_INSTRUCTION)
    key = columns.get("prompt", "prompt")

    def build(rec: Mapping[str, Any]) -> Prompt:
        text = instruction + _field(rec, key, "no_prompt")
        return make_prompt(
            dataset, (Message("user", text),), **_meta(rec, "task_id", "entry_point")
        )

    return _records(path, counter, build)


@reader("writingbench")
def read_writingbench(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """WritingBench: ``query`` as the user message; ``index``, ``domain1``, ``domain2`` kept."""
    key = columns.get("query", "query")

    def build(rec: Mapping[str, Any]) -> Prompt:
        msgs = (Message("user", _field(rec, key, "no_query")),)
        return make_prompt(dataset, msgs, **_meta(rec, "index", "domain1", "domain2"))

    return _records(path, counter, build)


@reader("magicoder-oss")
def read_magicoder_oss(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """Magicoder OSS-Instruct: ``problem`` as the user message; ``lang`` (and ``index``) kept.
    The dataset's ``solution`` is not part of the prompt."""
    key = columns.get("problem", "problem")

    def build(rec: Mapping[str, Any]) -> Prompt:
        msgs = (Message("user", _field(rec, key, "no_problem")),)
        return make_prompt(dataset, msgs, **_meta(rec, "lang", "index"))

    return _records(path, counter, build)


@reader("magicoder-evol")
def read_magicoder_evol(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """Magicoder Evol-Instruct: ``instruction`` as the user message (``response`` not used)."""
    key = columns.get("instruction", "instruction")

    def build(rec: Mapping[str, Any]) -> Prompt:
        msgs = (Message("user", _field(rec, key, "no_instruction")),)
        return make_prompt(dataset, msgs, **_meta(rec, "id", "index"))

    return _records(path, counter, build)


# --- BFCL --------------------------------------------------------------------------------------


def bfcl_tool(fn: Any) -> dict[str, Any]:
    """One BFCL function schema as an OpenAI tool with JSON Schema parameters."""
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise Skip("bad_functions")
    body = {k: (json_schema(v) if k == "parameters" else v) for k, v in fn.items()}
    return {"type": "function", "function": body}


def bfcl_messages(question: Any) -> tuple[Message, ...]:
    """``question`` is a list of turns, each a list of ``{role, content}``; the turns are
    concatenated (later turns of multi-turn items follow the first). Older files hold one turn
    as a flat list, or a plain string."""
    if isinstance(question, str):
        question = [[{"role": "user", "content": question}]]
    if not isinstance(question, list) or not question:
        raise Skip("no_question")
    if all(isinstance(t, Mapping) for t in question):
        question = [question]
    flat: list[Any] = []
    for turn in question:
        if not isinstance(turn, list):
            raise Skip("bad_question")
        flat += turn
    try:
        msgs = messages_of(flat)
    except InputError:
        raise Skip("bad_question") from None
    for m in msgs:
        if m.role in ("user", "system"):
            _text(m.content)
    return _with_user(msgs)


@reader("bfcl")
def read_bfcl(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """Berkeley Function-Calling Leaderboard (v3/v4 JSON lines): ``question`` turns and
    ``function`` schemas (BFCL types normalised to JSON Schema) as tools."""

    def build(rec: Mapping[str, Any]) -> Prompt:
        fns = rec.get("function")
        if isinstance(fns, Mapping):
            fns = [fns]
        if not isinstance(fns, list) or not fns:
            raise Skip("no_functions")  # e.g. multi_turn items, whose functions live elsewhere
        tools = tuple(bfcl_tool(f) for f in fns)
        meta = _meta(rec, "id")
        if isinstance(meta.get("id"), str) and re.fullmatch(r".+_\d+(-\d+)*", meta["id"]):
            meta["category"] = re.sub(r"_\d+(-\d+)*$", "", meta["id"])
        return make_prompt(dataset, bfcl_messages(rec.get("question")), tools, **meta)

    return _records(path, counter, build)


# --- Glaive function-calling v2 ----------------------------------------------------------------

_GLAIVE_TURN = re.compile(r"(?:\A|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]*")
_GLAIVE_EOT = "<|endoftext|>"
_GLAIVE_CALL = "<functioncall>"
#: Glaive's usual call: JSON except that ``arguments`` is a single-quoted JSON text
_GLAIVE_QUOTED = re.compile(
    r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*\'(.*)\'\s*\}\s*\Z', re.S
)


def glaive_system(text: Any) -> tuple[str | None, tuple[dict[str, Any], ...]]:
    """``SYSTEM: <prose> -\\n{schema}\\n{schema}...``: (prose or None, tools)."""
    if text is None or text == "":
        return None, ()
    if not isinstance(text, str):
        raise Skip("bad_system")
    s = re.sub(r"\A\s*SYSTEM:[ \t]*", "", text).replace(_GLAIVE_EOT, "").strip()
    start = s.find("{")
    prose = (s if start < 0 else s[:start]).strip() or None
    tools: list[dict[str, Any]] = []
    dec = json.JSONDecoder()
    i = start
    while 0 <= i < len(s):
        if s[i] != "{":
            raise Skip("bad_system")  # prose after the schemas
        try:
            obj, end = dec.raw_decode(s, i)
        except ValueError:
            raise Skip("bad_system") from None
        try:
            tools.append(function_tool(obj))
        except Skip:
            raise Skip("bad_system") from None
        i = len(s) - len(s[end:].lstrip())
    return prose, tuple(tools)


def glaive_call(text: str, calls: CallLinker) -> ToolCall:
    """The JSON after ``<functioncall>``: proper JSON, or Glaive's single-quoted arguments."""
    text = text.strip()
    try:
        obj, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        m = _GLAIVE_QUOTED.match(text)
        if m is None:
            raise Skip("bad_function_call") from None
        try:
            name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            raise Skip("bad_function_call") from None
        return calls.call(name, m.group(2))
    if not isinstance(obj, Mapping) or text[end:].strip():
        raise Skip("bad_function_call")
    return calls.call(obj.get("name"), obj.get("arguments"))


def glaive_messages(chat: Any) -> list[Message]:
    if not isinstance(chat, str) or not chat.strip():
        raise Skip("no_chat")
    parts = _GLAIVE_TURN.split(chat)
    if parts[0].replace(_GLAIVE_EOT, "").strip():
        raise Skip("bad_chat")  # text before the first USER:/ASSISTANT: marker
    msgs: list[Message] = []
    calls = CallLinker()
    for marker, raw in zip(parts[1::2], parts[2::2], strict=True):
        body = raw.replace(_GLAIVE_EOT, "").strip()
        if marker == "USER":
            calls.user_turn()
            msgs.append(Message("user", _text(body)))
        elif marker == "FUNCTION RESPONSE":
            msgs.append(calls.result(_text(body)))
        else:
            text, *call_texts = body.split(_GLAIVE_CALL)
            tcs = tuple(glaive_call(c, calls) for c in call_texts)
            content = text.strip() or None
            if content is None and not tcs:
                raise Skip("empty_turn")
            msgs.append(Message("assistant", content, tool_calls=tcs))
    return msgs


@reader("glaive")
def read_glaive(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """Glaive function-calling v2: a ``system`` string (prose, then function schemas as JSON)
    and a ``chat`` string of ``USER:`` / ``ASSISTANT:`` / ``FUNCTION RESPONSE:`` turns, with
    ``<functioncall> {...}`` calls and ``<|endoftext|>`` terminators (stripped)."""
    sys_key = columns.get("system", "system")
    chat_key = columns.get("chat", "chat")

    def build(rec: Mapping[str, Any]) -> Prompt:
        prose, tools = glaive_system(rec.get(sys_key))
        msgs = glaive_messages(rec.get(chat_key))
        if prose is not None:
            msgs.insert(0, Message("system", prose))
        return make_prompt(dataset, _with_user(msgs), tools, **_meta(rec, "id"))

    return _records(path, counter, build)


# --- UltraChat ---------------------------------------------------------------------------------


@reader("ultrachat")
def read_ultrachat(
    path: Path, dataset: str, columns: Mapping[str, str], counter: Counter[str]
) -> Iterator[Prompt]:
    """UltraChat: ``id`` and ``data[]``, alternating user/assistant strings starting with the
    user; or the HF ``ultrachat_200k`` shape ``prompt``, ``prompt_id``, ``messages[{role,
    content}]``."""

    def build(rec: Mapping[str, Any]) -> Prompt:
        data = rec.get("data")
        if data is not None:
            if not isinstance(data, list) or not data:
                raise Skip("no_data")
            roles: tuple[Role, Role] = ("user", "assistant")
            msgs = tuple(Message(roles[i % 2], _text(t)) for i, t in enumerate(data))
            return make_prompt(dataset, msgs, **_meta(rec, "id"))
        raw = rec.get("messages")
        if raw is not None:
            if not isinstance(raw, list) or not raw:
                raise Skip("no_messages")
            try:
                msgs = messages_of(raw)
            except InputError:
                raise Skip("bad_message") from None
            for m in msgs:
                _text(m.content)
        elif rec.get("prompt") is not None:
            msgs = (Message("user", _text(rec["prompt"])),)
        else:
            raise Skip("no_data")
        return make_prompt(dataset, _with_user(msgs), **_meta(rec, "prompt_id", "id"))

    return _records(path, counter, build)
