"""SpecForge: our exact ids as the pre-tokenized JSONL that ``data.prompts_path`` reads
(``prepare_prompt_tasks``: rows with ``input_ids`` and ``loss_mask`` pass through as they are), and,
only on request, the conversations SpecForge tokenizes itself.

Mask convention: the same mask as every export, 1 on every token the model produced. SpecForge
shifts it by two positions for its labels (it trains labels P+2..n), so its first proposal, the
answer's first token, is never trained; that is SpecForge's choice and the ids are not moved
to undo it.

``specforge-conversations`` is lossy by construction: SpecForge re-tokenizes the text with the
stock tokenizer, which splits some answers differently from the model, adds trained tokens the
model never produced (a newline after the end marker, an end marker after an answer cut at
max_tokens) and cannot tell where the model stopped. Every record says so (``lossy``), and the
system text the format rendered (a template's default system prompt) is written out, since the
trainer would otherwise render its own default in its place."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...records import Message
from ...records.wire import messages_to_wire
from .speculators import pretokenized_row, run_samples

if TYPE_CHECKING:
    from ...generate.runner import Runner

LOSSY = (
    "re-tokenized by SpecForge with the stock tokenizer: splits, end markers and cut answers "
    "may differ from the model's own ids; train on specforge.jsonl (data.prompts_path) instead"
)


def write_pretokenized(runner: Runner, folder: Path) -> Path:
    path = folder / "specforge.jsonl"
    tmp = folder / ".specforge.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        for s in run_samples(runner):
            f.write(json.dumps(pretokenized_row(s)) + "\n")
    os.replace(tmp, path)
    return path


def rendered_system(runner: Runner) -> str | None:
    """The system text the format inserts when a conversation has none (None: it inserts none)."""
    text = getattr(runner.bound.format, "default_system", None)
    return text if isinstance(text, str) and text != "auto" else None


def write_conversations(runner: Runner, folder: Path) -> Path:
    path = folder / "specforge-conversations.jsonl"
    tmp = folder / ".specforge-conversations.jsonl.tmp"
    system = rendered_system(runner)
    with tmp.open("w", encoding="utf-8") as f:
        for d in runner.m.datasets:
            have = {s.key for s in runner.ledger.samples(d.name)}
            for a in runner.conversations(d):
                if a.key not in have:
                    continue  # dropped at the tokens stage: not training data
                v = a.view
                answer = Message("assistant", v.content or "", v.reasoning, v.tool_calls)
                msgs = list(a.messages)
                if system is not None and (not msgs or msgs[0].role != "system"):
                    msgs.insert(0, Message("system", system))
                conv = messages_to_wire([*msgs, answer], reasoning=True)
                for m in conv:
                    m["content"] = m["content"] or ""
                rec: dict[str, Any] = {"id": a.key.sample_id, "lossy": LOSSY, "conversations": conv}
                if a.prompt.tools:
                    rec["tools"] = list(a.prompt.tools)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
