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
trainer would otherwise render its own default in its place.

The pre-tokenized writer takes the export's samples (any iterable, read once) and its manifest;
the conversations writer the answered conversations that became samples and the system text."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...files import atomic_path
from ...records import Answered, Message, Sample
from ...records.export import ExportManifest
from ...records.wire import messages_to_wire
from .speculators import write_jsonl

LOSSY = (
    "re-tokenized by SpecForge with the stock tokenizer: splits, end markers and cut answers "
    "may differ from the model's own ids; train on specforge.jsonl (data.prompts_path) instead"
)


def write_pretokenized(
    samples: Iterable[Sample], manifest: ExportManifest, folder: Path
) -> tuple[Path, ...]:
    """``folder/specforge.jsonl``: the rows of ``speculators.jsonl`` (SpecForge reads the same
    pre-tokenized shape)."""
    return (write_jsonl(samples, folder / "specforge.jsonl"),)


def rendered_system(fmt: Any) -> str | None:
    """The system text the chat format ``fmt`` inserts when a conversation has none (None: it
    inserts none)."""
    text = getattr(fmt, "default_system", None)
    return text if isinstance(text, str) and text != "auto" else None


def conversation_record(a: Answered, system: str | None) -> dict[str, Any]:
    """One answered conversation as SpecForge's conversations row (``system`` first where the
    conversation has no system message of its own)."""
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
    return rec


def write_conversations(
    answers: Iterable[Answered], folder: Path, system: str | None
) -> tuple[Path, ...]:
    """``folder/specforge-conversations.jsonl`` from the conversations that became samples (the
    caller leaves out those dropped at the tokens stage: not training data)."""
    path = folder / "specforge-conversations.jsonl"
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for a in answers:
            f.write(json.dumps(conversation_record(a, system), ensure_ascii=False) + "\n")
    return (path,)
