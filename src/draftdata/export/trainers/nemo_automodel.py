"""NeMo Automodel (``nemo-automodel``): its EAGLE-3 recipe (``recipes/llm/train_eagle3.py``) reads
training data only as conversations: ``build_eagle3_dataloader`` wraps ``ChatDataset``, which
renders each row's ``messages`` with the tokenizer's chat template and derives the mask from the
render (``format_chat_template``). No option of the recipe takes token ids. Its one id-carrying
input, the offline cache (``cached_target_path``, ``CachedEagle3Dataset``), also holds the
target's aux hidden states and its draft-vocab distribution (``target_probs``), so only a target
forward can make it, not an export.

So two exports:

- ``nemo-automodel``: our ids as the rows NeMo's EAGLE-3 data code works on after rendering
  (``ChatDataset(unshifted=True, padding="do_not_pad")``: ``input_ids``, ``loss_mask`` 0/1 and
  ``attention_mask``, unshifted, unpadded), which its own ``build_packed_eagle3_dataset`` packs and
  its collators stack as they are; wiring them in means replacing the recipe's dataset (a code
  change, not a config option).
- ``nemo-automodel-conversations``: LOSSY, the ``messages`` (and ``tools``) rows the recipe's
  ``data_path`` reads; NeMo re-renders them with the stock template.

Mask convention: the same mask as every export (1 on every id the model produced), unshifted as
``ChatDataset(unshifted=True)`` gives it; the EAGLE-3 trainer shifts it itself."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...files import atomic_path
from ...records import Answered, Sample
from ...records.export import ExportManifest
from .specforge import conversation_record

JSONL = "nemo-automodel.jsonl"
CONVERSATIONS = "nemo-automodel-conversations.jsonl"

LOSSY = (
    "re-rendered by NeMo Automodel's ChatDataset with the stock chat template: splits, end "
    "markers and cut answers may differ from the model's own ids, and the mask is derived from "
    "the render; nemo-automodel.jsonl holds the exact ids"
)


def row(s: Sample) -> dict[str, Any]:
    """One sample as NeMo's unshifted, unpadded EAGLE-3 row."""
    n = len(s.input_ids)
    return {
        "id": s.id,
        "input_ids": s.input_ids,
        "loss_mask": [int(b) for b in s.loss_mask],
        "attention_mask": [1] * n,
    }


def write_rows(
    samples: Iterable[Sample], manifest: ExportManifest, folder: Path
) -> tuple[Path, ...]:
    """``folder/nemo-automodel.jsonl``: one row per sample in export order."""
    path = folder / JSONL
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(row(s)) + "\n")
    return (path,)


def messages_record(a: Answered, system: str | None) -> dict[str, Any]:
    """One answered conversation as ChatDataset's OpenAI ``messages`` row (the format's system
    text first where the conversation has none)."""
    rec = conversation_record(a, system)
    rec["messages"] = rec.pop("conversations")
    rec["lossy"] = LOSSY
    return rec


def write_conversations(
    answers: Iterable[Answered], folder: Path, system: str | None
) -> tuple[Path, ...]:
    """``folder/nemo-automodel-conversations.jsonl`` from the conversations that became
    samples."""
    path = folder / CONVERSATIONS
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for a in answers:
            f.write(json.dumps(messages_record(a, system), ensure_ascii=False) + "\n")
    return (path,)
