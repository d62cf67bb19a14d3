"""The 200 answers of the replay server's message faults: what replaces
``"choices":[...],"usage":{...}`` of a record's normal answer (``fault_tail``).

Pure functions over a ``ReplayRecord``; the server adds the head (id, object, created, model)."""

from __future__ import annotations

import zlib
from functools import cache
from typing import Any

from .faults import INJECTED_TOOL_CALL, REASONING_SHAPES, REASONING_TEXT
from .replay_records import ReplayRecord, _dumps

#: the faults whose answer is a 200 with an altered ``choices`` / ``usage`` (see ``fault_tail``)
MESSAGE_FAULTS = frozenset(
    {
        "empty",
        "length",
        "reasoning",
        "tools",
        "badtools",
        "strmessage",
        "nousage",
        "overlong",
        "huge",
    }
)
#: what ``badtools`` puts in ``message.tool_calls`` instead of a list, rotating per attempt:
#: the list as a JSON string, or its one call as a bare object
BADTOOLS_SHAPES = ("string", "object")
#: ``overlong`` repeats the record's content at least this many times ...
OVERLONG_REPEATS = 4
#: ... and more if needed to report over twice the request's ``max_tokens``, up to this size
OVERLONG_MAX_CHARS = 4 * 2**20
HUGE_SENTENCE = "The replay server repeats this sentence to make a huge answer. "
#: tokens of ``HUGE_SENTENCE`` in common BPE vocabularies (Llama 3, Qwen3, DeepSeek-V3: 12-13)
HUGE_SENTENCE_TOKENS = 12
#: the ``huge`` content is ``HUGE_SENTENCE`` repeated to just over this many bytes (16 MiB)
HUGE_BYTES = 16 * 2**20
HUGE_REPEATS = HUGE_BYTES // len(HUGE_SENTENCE.encode()) + 1


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def overlong_repeats(rec: ReplayRecord, max_tokens: int | None) -> int:
    """How many times ``overlong`` repeats ``rec.content``: ``OVERLONG_REPEATS``, or enough that
    the reported completion tokens exceed twice ``max_tokens``, within ``OVERLONG_MAX_CHARS``."""
    n_out = max(1, len(rec.output_ids))
    k = OVERLONG_REPEATS
    if max_tokens is not None:
        k = max(k, 2 * max_tokens // n_out + 1)
    return min(k, max(OVERLONG_REPEATS, OVERLONG_MAX_CHARS // max(1, len(rec.content))))


@cache
def huge_content_json() -> str:
    """The ``huge`` content as a JSON string literal, built once (about 16 MiB)."""
    return _dumps(HUGE_SENTENCE * HUGE_REPEATS)


def fault_tail(
    rec: ReplayRecord, fault: str, attempt: int, want_ids: bool, max_tokens: int | None
) -> str:
    """``"choices":[...],"usage":{...}`` of ``rec``'s answer under a fault of
    ``MESSAGE_FAULTS``. With ``want_ids``, ``prompt_token_ids`` is added; ``choices[0].token_ids``
    only for ``nousage``, the one fault that leaves the message as the ids describe it."""
    prompt_ids = f',"prompt_token_ids":{_dumps(rec.prompt_ids)}' if want_ids else ""
    if fault == "huge":
        choice = (
            f'{{"index":0,"message":{{"role":"assistant","content":{huge_content_json()}}},'
            '"finish_reason":"stop","logprobs":null}'
        )
        usage = _usage(len(rec.prompt_ids), HUGE_REPEATS * HUGE_SENTENCE_TOKENS)
        return f'"choices":[{choice}],"usage":{_dumps(usage)}' + prompt_ids
    message: Any = {"role": "assistant", "content": rec.content}
    finish = rec.finish_reason
    out: dict[str, Any] = {"choices": [], "usage": rec.usage()}
    extra: dict[str, Any] = {}
    if fault == "empty":
        message["content"], finish = "", "stop"
    elif fault == "length":
        message["content"], finish = rec.content[: len(rec.content) // 2], "length"
    elif fault in ("tools", "badtools"):
        message["content"], finish = None, "tool_calls"
        message["tool_calls"] = [INJECTED_TOOL_CALL]
        if fault == "badtools":
            shape = BADTOOLS_SHAPES[(zlib.crc32(rec.id.encode()) + attempt) % 2]
            message["tool_calls"] = (
                _dumps([INJECTED_TOOL_CALL]) if shape == "string" else dict(INJECTED_TOOL_CALL)
            )
    elif fault == "reasoning":
        shape = REASONING_SHAPES[(zlib.crc32(rec.id.encode()) + attempt) % 3]
        if shape == "reasoning_details":
            message[shape] = [{"type": "reasoning.text", "text": REASONING_TEXT}]
        else:
            message[shape] = REASONING_TEXT
    elif fault == "strmessage":
        message = rec.content
    elif fault == "nousage":
        del out["usage"]
        if want_ids:
            extra["token_ids"] = list(rec.output_ids)
    elif fault == "overlong":
        k = overlong_repeats(rec, max_tokens)
        message["content"], finish = rec.content * k, "stop"
        out["usage"] = _usage(len(rec.prompt_ids), k * len(rec.output_ids))
    else:
        raise ValueError(f"{fault!r} is not a message fault")
    out["choices"] = [
        {"index": 0, "message": message, "finish_reason": finish, "logprobs": None, **extra}
    ]
    return _dumps(out)[1:-1] + prompt_ids
