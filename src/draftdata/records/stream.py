"""A chat completion streamed as server-sent events (``stream: true``), read as it arrives and
put back together in the shape of a whole one, so ``records.wire.parse_answer`` reads it like
any other answer.

Why stream at all: a server that ignores ``max_tokens`` writes until it stops on its own, and
with a whole-body answer every token of it is paid before a byte arrives. Streamed, the client
sees the answer grow and hangs up at the token that passes its limit.

What is put back together, per choice: the delta's ``content``, ``reasoning`` /
``reasoning_content`` and ``refusal`` (text, joined), ``reasoning_details`` (lists, joined; an
entry streamed a piece per event is joined back into one, ``_join_details``),
``tool_calls`` (by ``index``: id, type and name as first given, ``arguments`` joined),
the choice's ``token_ids`` / ``response_token_ids`` and ``logprobs.content`` (joined), its
last ``finish_reason``, ``stop_reason`` and ``matched_stop``; at the top level the first ``id``, ``model``,
``created``, ``provider``, the ids of the prompt (vLLM sends them in the first event) and the
last ``usage``. ``stream_events`` counts the events read. Comments (``: PROCESSING``) are
skipped; ``[DONE]`` ends the stream. An event whose fields have the wrong type, or that is not
JSON, makes the answer ``problem`` (quarantined by its reader); an ``error`` event ends it.

What a caller can stop on: ``chars`` counts the answer's text (its content, its reasoning,
whether sent as text or only in ``reasoning_details`` (the longer of the two per event: OpenRouter
sends both), tool-call names and arguments), and ``held`` what the answer keeps in memory,
every field included (encrypted reasoning, choices and tool calls by index, log-probabilities),
so that no field a caller does not count grows without bound."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: the delta fields that hold text, joined in order
TEXT_FIELDS = ("content", "reasoning", "reasoning_content", "refusal")
#: the choice fields that hold lists, joined in order (the answer's ids)
LIST_FIELDS = ("token_ids", "response_token_ids")
#: choice fields kept as the last event gives them, null included (the server's marks)
LAST_FIELDS = ("stop_reason", "matched_stop")
#: top-level fields kept as the first event gives them
FIRST_FIELDS = ("id", "model", "created", "provider", "system_fingerprint")
#: the delta fields that hold the reasoning as text (``reasoning_details`` may repeat it)
REASONING_FIELDS = ("reasoning", "reasoning_content")
#: bytes taken for what a new choice, tool call, detail or log-probability entry keeps beside
#: its text (Python objects: a few hundred bytes each)
ENTRY_BYTES = 256


@dataclass
class _Call:
    id: Any = None
    type: Any = None
    name: Any = None
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Choice:
    role: Any = None
    texts: dict[str, list[str]] = field(default_factory=dict)
    details: list[Any] | None = None
    calls: dict[int, _Call] = field(default_factory=dict)
    lists: dict[str, list[Any]] = field(default_factory=dict)
    logprobs: list[Any] | None = None
    finish_reason: Any = None
    #: fields kept as the last event gives them, null included (vLLM's ``stop_reason``)
    last: dict[str, Any] = field(default_factory=dict)
    prompt_token_ids: Any = None


#: the text field a streamed ``reasoning_details`` entry of each type grows by
DETAIL_TEXT = {"reasoning.text": "text", "reasoning.summary": "summary"}


@dataclass
class _Detail:
    """A ``reasoning_details`` entry being put back together: its fields as first sent, and the
    pieces of its text field ``key`` (joined once, in ``whole``: joining at every event copied
    the block so far each time)."""

    entry: dict[str, Any]
    key: str
    parts: list[str]

    def continued_by(self, d: dict[str, Any]) -> bool:
        return (
            d.get("type") == self.entry["type"]
            and isinstance(d.get("index"), int)
            and d["index"] == self.entry.get("index")
            and isinstance(d.get(self.key), str)
            and all(
                v is None or self.entry.get(k) in (None, v) for k, v in d.items() if k != self.key
            )
        )

    def whole(self) -> dict[str, Any]:
        return {**self.entry, self.key: "".join(self.parts)}


def _join_details(have: list[Any], new: list[Any]) -> list[Any]:
    """``have`` with the entries of one event's ``reasoning_details`` added. OpenRouter streams an
    entry a token at a time: each event repeats its ``type``, ``index`` and ``format`` with the
    next piece of its text. A piece that continues the last entry (same type and numbered
    index, no field that disagrees) is joined to it, so the answer holds the entry once, as a
    whole answer does; anything else (encrypted data, a new index) is an entry of its own.
    Entries still growing are ``_Detail``s (``_details_out`` gives the answer's list)."""
    for d in new:
        last = have[-1] if have else None
        if isinstance(d, dict) and isinstance(last, _Detail) and last.continued_by(d):
            last.parts.append(d[last.key])
            for k, v in d.items():
                if v is not None and last.entry.get(k) is None:
                    last.entry[k] = v
            continue
        kind = d.get("type") if isinstance(d, dict) else None
        key = DETAIL_TEXT.get(kind) if isinstance(kind, str) else None
        if key is not None and isinstance(d.get(key), str):
            have.append(_Detail(dict(d), key, [d[key]]))
        else:
            have.append(dict(d) if isinstance(d, dict) else d)
    return have


def _detail_sizes(new: list[Any]) -> tuple[str, int]:
    """One event's ``reasoning_details``: the reasoning text its entries carry (a text or a
    summary), and the bytes of all else they hold (encrypted data, other fields)."""
    text: list[str] = []
    other = 0
    for d in new:
        other += ENTRY_BYTES
        if not isinstance(d, dict):
            continue
        kind = d.get("type")
        key = DETAIL_TEXT.get(kind) if isinstance(kind, str) else None
        for k, v in d.items():
            if k == key and isinstance(v, str):
                text.append(v)
            elif isinstance(v, str):
                other += len(v)
            elif isinstance(v, (dict, list)):
                other += len(json.dumps(v))
    return "".join(text), other


def _details_out(have: list[Any]) -> list[Any]:
    return [x.whole() if isinstance(x, _Detail) else x for x in have]


class StreamAssembly:
    """Feed it a stream's bytes as they come (``feed``); ``body()`` is the completion so far.
    ``chars`` counts the text received (content, reasoning, tool-call names and arguments) and
    ``ids`` the answer ids, so a caller can stop a stream that runs too long."""

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self.events = 0
        self.done = False
        self.error: str | None = None
        self.problem: str | None = None
        self.chars = 0
        #: what the answer so far keeps in memory, in bytes (about): ``chars`` and every other
        #: field (encrypted reasoning, new choices and calls, log-probabilities, ids)
        self.held = 0
        #: the text received since a caller last took it (``take_fresh``), to count in pieces
        self.fresh: list[str] = []
        self.ids = 0
        self._top: dict[str, Any] = {}
        self._usage: Any = None
        self._choices: dict[int, _Choice] = {}
        self._line = bytearray()
        self._data: list[bytes] = []

    # -- reading ----------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Reads ``data``: whole lines are taken, a partial one waits for the rest."""
        start = 0
        while not self.done:
            end = data.find(b"\n", start)
            if end < 0:
                self._line += data[start:]
                if len(self._line) > self.max_event_bytes:
                    self._fail(f"an event line of more than {self.max_event_bytes:,} bytes")
                return
            self._line += data[start:end]
            self._take(bytes(self._line).rstrip(b"\r"))
            self._line.clear()
            start = end + 1

    def finish(self, hung_up: bool = False) -> None:
        """The stream ended: a last event not followed by a blank line still counts, unless
        the client hung up (``hung_up``): then the last line may be an event cut in two (a proxy
        passes a stream on in pieces of its own size), and it is not part of the answer."""
        if hung_up:
            self._line.clear()
            self._data.clear()
            return
        if self._line:
            self._take(bytes(self._line).rstrip(b"\r"))
            self._line.clear()
        self._take(b"")

    def _take(self, line: bytes) -> None:
        if line.startswith(b":"):
            return  # a comment: a keep-alive
        if line:
            if line.startswith(b"data:"):
                self._data.append(line[5:].removeprefix(b" "))
            return  # event:, id:, retry: carry nothing an answer needs
        if not self._data:
            return
        raw = b"\n".join(self._data)
        self._data.clear()
        if raw.strip() == b"[DONE]":
            self.done = True
            return
        self.events += 1
        try:
            event = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            self._fail(f"event {self.events} is not UTF-8 at byte {e.start:,}")
            return
        except (ValueError, RecursionError):
            self._fail(f"event {self.events} is not JSON")
            return
        if not isinstance(event, dict):
            self._fail(f"event {self.events} is a {type(event).__name__}, not an object")
            return
        if event.get("error") is not None:
            self.error = json.dumps(event["error"], ensure_ascii=False)[:500]
            self.done = True
            return
        try:
            self._merge(event)
        except TypeError as e:
            self._fail(f"event {self.events}: {e}")

    def _fail(self, why: str) -> None:
        if self.problem is None:
            self.problem = why

    def _merge(self, event: dict[str, Any]) -> None:
        for k in FIRST_FIELDS:
            if k in event and k not in self._top:
                self._top[k] = event[k]
        if event.get("prompt_token_ids") is not None:
            self._top["prompt_token_ids"] = event["prompt_token_ids"]
        if event.get("usage") is not None:
            self._usage = event["usage"]
        choices = event.get("choices") or []
        if not isinstance(choices, list):
            raise TypeError("choices is not a list")
        for ch in choices:
            if not isinstance(ch, dict):
                raise TypeError("a choice is not an object")
            index = ch.get("index", 0)
            if not isinstance(index, int):
                raise TypeError("a choice's index is not a number")
            if index not in self._choices:
                self._choices[index] = _Choice()
                self.held += ENTRY_BYTES
            self._merge_choice(self._choices[index], ch)

    def _merge_choice(self, c: _Choice, ch: dict[str, Any]) -> None:
        delta = ch.get("delta") or {}
        if not isinstance(delta, dict):
            raise TypeError("a delta is not an object")
        if delta.get("role") is not None:
            c.role = delta["role"]
        thought: list[str] = []  # the reasoning as text in this event
        for k in TEXT_FIELDS:
            v = delta.get(k)
            if v is None:
                continue
            if not isinstance(v, str):
                raise TypeError(f"delta.{k} is not text")
            c.texts.setdefault(k, []).append(v)
            if k in REASONING_FIELDS:
                thought.append(v)
            elif k == "content":
                self._grew(v)
            else:
                self.held += len(v)
        details = delta.get("reasoning_details")
        if details is not None:
            if not isinstance(details, list):
                raise TypeError("delta.reasoning_details is not a list")
            c.details = _join_details(c.details or [], details)
            in_details, other = _detail_sizes(details)
            self.held += other
            if len(in_details) > sum(map(len, thought)):  # the reasoning, sent only here
                thought = [in_details]
        for v in thought:
            self._grew(v)
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise TypeError("delta.tool_calls is not a list")
            for tc in calls:
                self._merge_call(c, tc)
        for k in LIST_FIELDS:
            v = ch.get(k)
            if v is None:
                continue
            if not isinstance(v, list):
                raise TypeError(f"{k} is not a list")
            c.lists.setdefault(k, []).extend(v)
            self.ids += len(v)
            self.held += 8 * len(v)
        lp = ch.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            c.logprobs = (c.logprobs or []) + lp["content"]
            self.held += ENTRY_BYTES * sum(
                1 + len(e.get("top_logprobs") or ()) if isinstance(e, dict) else 1
                for e in lp["content"]
            )
        if ch.get("finish_reason") is not None:
            c.finish_reason = ch["finish_reason"]
        for k in LAST_FIELDS:
            if k in ch:
                c.last[k] = ch[k]
        if ch.get("prompt_token_ids") is not None:
            c.prompt_token_ids = ch["prompt_token_ids"]

    def _merge_call(self, c: _Choice, tc: Any) -> None:
        if not isinstance(tc, dict):
            raise TypeError("a tool call delta is not an object")
        index = tc.get("index")
        if index is None:  # no index: a call with a new id is the next one
            new = tc.get("id") is not None and all(x.id != tc["id"] for x in c.calls.values())
            index = len(c.calls) if new or not c.calls else max(c.calls)
        if not isinstance(index, int):
            raise TypeError("a tool call's index is not a number")
        if index not in c.calls:
            c.calls[index] = _Call()
            self.held += ENTRY_BYTES
        call = c.calls[index]
        if tc.get("id") is not None and call.id is None:
            call.id = tc["id"]
            self.held += len(str(call.id))
        if tc.get("type") is not None and call.type is None:
            call.type = tc["type"]
        fn = tc.get("function") or {}
        if not isinstance(fn, dict):
            raise TypeError("a tool call's function is not an object")
        name, args = fn.get("name"), fn.get("arguments")
        if name is not None:
            if not isinstance(name, str):
                raise TypeError("a tool call's name is not text")
            if call.name is None:
                call.name = name
                self._grew(name)
        if args is not None:
            if not isinstance(args, str):
                raise TypeError("a tool call's arguments are not text")
            call.arguments.append(args)
            self._grew(args)

    def _grew(self, text: str) -> None:
        self.chars += len(text)
        self.held += len(text)
        self.fresh.append(text)

    def take_fresh(self) -> str:
        """The text received since the last call, in order."""
        out = "".join(self.fresh)
        self.fresh.clear()
        return out

    # -- the answer ------------------------------------------------------------------------------
    def body(self) -> dict[str, Any]:
        """The completion in the shape of a whole (non-streamed) one."""
        out: dict[str, Any] = {**self._top, "object": "chat.completion"}
        out["choices"] = [self._choice(i, c) for i, c in sorted(self._choices.items())]
        if self._usage is not None:
            out["usage"] = self._usage
        out["stream_events"] = self.events
        return out

    @staticmethod
    def _choice(index: int, c: _Choice) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": c.role or "assistant"}
        msg["content"] = "".join(c.texts["content"]) if "content" in c.texts else None
        for k in TEXT_FIELDS[1:]:
            if k in c.texts:
                msg[k] = "".join(c.texts[k])
        if c.details is not None:
            msg["reasoning_details"] = _details_out(c.details)
        if c.calls:
            msg["tool_calls"] = [
                {
                    "id": x.id,
                    "type": x.type or "function",
                    "function": {"name": x.name or "", "arguments": "".join(x.arguments)},
                }
                for _, x in sorted(c.calls.items())
            ]
        out: dict[str, Any] = {"index": index, "message": msg, "finish_reason": c.finish_reason}
        out.update(c.last)
        out.update({k: v for k, v in c.lists.items()})
        if c.logprobs is not None:
            out["logprobs"] = {"content": c.logprobs}
        if c.prompt_token_ids is not None:
            out["prompt_token_ids"] = c.prompt_token_ids
        return out
