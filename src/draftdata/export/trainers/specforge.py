"""SpecForge conversations: the messages and the model's answer as OpenAI chat messages
(reasoning as ``reasoning_content``, tool calls, tool schemas). SpecForge tokenizes them itself."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...records import Message
from ...records.wire import messages_to_wire

if TYPE_CHECKING:
    from ...generate.runner import Runner


def write_conversations(runner: Runner, folder: Path) -> Path:
    path = folder / "specforge.jsonl"
    tmp = folder / ".specforge.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        for d in runner.m.datasets:
            have = {s.key for s in runner.ledger.samples(d.name)}
            for a in runner.conversations(d):
                if a.key not in have:
                    continue  # dropped at the tokens stage: not training data
                v = a.view
                answer = Message("assistant", v.content or "", v.reasoning, v.tool_calls)
                conv = messages_to_wire([*a.messages, answer], reasoning=True)
                for m in conv:
                    m["content"] = m["content"] or ""
                rec: dict[str, Any] = {"id": a.key.sample_id, "conversations": conv}
                if a.prompt.tools:
                    rec["tools"] = list(a.prompt.tools)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
