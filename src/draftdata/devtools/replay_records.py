"""Ground-truth records for the replay server: loading a JSONL file (``load_records``), the
canonical conversation key a request is matched by (``message_key``), and ``ReplayRecord``, one
generation with its normal answer serialised once."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import not_a_file
from ..lines import capped_lines
from ..nesting import TooDeep, loads_json

_REQUIRED = ("id", "messages", "prompt_ids", "output_ids", "api_view")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _text_of(content: Any) -> Any:
    """Content given as a list of parts becomes the join of their texts; anything else as is."""
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    return content


def message_key(messages: Any) -> str:
    """Canonical key of a conversation: role and content of each message, other keys ignored.

    Raises ValueError with a client-facing message when ``messages`` is not a list of objects
    with a role."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    norm = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        norm.append({"role": m["role"], "content": _text_of(m.get("content"))})
    return json.dumps(norm, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class ReplayRecord:
    """One ground-truth generation; its normal response pieces are serialised once, on first use."""

    id: str
    key: str
    content: str
    finish_reason: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]

    def usage(self) -> dict[str, int]:
        n_in, n_out = len(self.prompt_ids), len(self.output_ids)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

    def _tail(self, token_ids: bool) -> str:
        message = _dumps({"role": "assistant", "content": self.content})
        choice = (
            f'{{"index":0,"message":{message},"finish_reason":{_dumps(self.finish_reason)},'
            '"logprobs":null'
            + (f',"token_ids":{_dumps(self.output_ids)}' if token_ids else "")
            + "}"
        )
        out = f'"choices":[{choice}],"usage":{_dumps(self.usage())}'
        return out + (f',"prompt_token_ids":{_dumps(self.prompt_ids)}' if token_ids else "")

    @cached_property
    def tail(self) -> str:
        """``"choices":[...],"usage":{...}`` of the unfaulted answer, serialised on first use."""
        return self._tail(token_ids=False)

    @cached_property
    def tail_ids(self) -> str:
        """``tail`` with ``choices[0].token_ids`` and top-level ``prompt_token_ids`` (vLLM)."""
        return self._tail(token_ids=True)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ReplayRecord:
        """Raises InputError naming the first problem; the loader counts it as a skip."""
        missing = [k for k in _REQUIRED if k not in raw]
        if missing:
            raise InputError(f"record lacks {', '.join(missing)}")
        rid, view = raw["id"], raw["api_view"]
        if not isinstance(rid, str) or not rid:
            raise InputError("record 'id' must be a non-empty string")
        if not isinstance(view, Mapping) or not isinstance(view.get("content"), str):
            raise InputError(f"{rid}: api_view.content must be a string")
        finish = view.get("finish_reason") or raw.get("finish_reason") or "stop"
        prompt_ids, output_ids = raw["prompt_ids"], raw["output_ids"]
        for name, ids in (("prompt_ids", prompt_ids), ("output_ids", output_ids)):
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise InputError(f"{rid}: {name} must be a list of integers")
        try:
            key = message_key(raw["messages"])
        except ValueError as e:
            raise InputError(f"{rid}: {e}") from None
        return cls(
            id=rid,
            key=key,
            content=view["content"],
            finish_reason=str(finish),
            prompt_ids=tuple(prompt_ids),
            output_ids=tuple(output_ids),
        )


def load_records(path: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Records of a ground-truth JSONL file and the count of skipped lines by reason
    (``malformed_json``, ``too_deep``, ``not_an_object``, ``bad_record``, ``line_too_long:N``).
    Reading is all up front."""
    kind = not_a_file(path)
    if kind is not None:
        raise InputError(f"{path}: not a regular file ({kind}); give a JSONL file")
    records: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    try:
        with path.open("rb") as f:
            lines = [raw.decode("utf-8") for raw in capped_lines(f, skipped)]
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror}); check the path") from e
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 ({e.reason}); give a JSONL file") from e
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = loads_json(line)
        except ValueError as e:
            reason = "too_deep" if isinstance(e, TooDeep) else "malformed_json"
        else:
            if not isinstance(rec, dict):
                reason = "not_an_object"
            elif any(k not in rec for k in _REQUIRED):
                reason = "bad_record"
            else:
                records.append(rec)
                continue
        skipped[reason] = skipped.get(reason, 0) + 1
    return records, skipped
