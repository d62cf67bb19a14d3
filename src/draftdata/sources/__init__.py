"""Readers: native prompt-dataset formats -> ``Prompt`` records (stable id = content hash).

Malformed records are skipped and counted by reason, never fatal. The table and the shared
helpers live in ``base``; importing the package registers every reader (native, tabular)."""

from . import native, tabular  # noqa: F401  (register their readers)
from .base import (
    READERS,
    Reader,
    iter_json_records,
    iter_prompts,
    make_prompt,
    open_bytes,
    open_text,
    prompt_chars,
    prompt_id,
    read_ground_truth,
    read_mtbench,
    read_openai_messages,
    read_prompts,
    reader,
)

__all__ = [
    "READERS",
    "Reader",
    "iter_json_records",
    "iter_prompts",
    "make_prompt",
    "open_bytes",
    "open_text",
    "prompt_chars",
    "prompt_id",
    "read_ground_truth",
    "read_mtbench",
    "read_openai_messages",
    "read_prompts",
    "reader",
]
