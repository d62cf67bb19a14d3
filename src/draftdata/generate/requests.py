"""Conversations as generation asks them: tool schemas written into the system prompt for
formats without a tool prompt, and each request's sampling seed. The turns a prompt has and the
messages each is answered with are ``tokens.history``'s (the run's tokens stage rebuilds
them too)."""

from __future__ import annotations

import hashlib
import json

from ..records import Message, Prompt

TOOLS_SYSTEM = (
    "You can call these functions: {tools}\nTo call functions, answer with a JSON object "
    '{{"name": ..., "arguments": {{...}}}} or a JSON list of such objects.'
)


def with_system(p: Prompt, text: str) -> Prompt:
    """``p`` with ``text`` as its system message, where it has none of its own."""
    if p.messages and p.messages[0].role == "system":
        return p
    return Prompt(p.id, p.dataset, (Message("system", text), *p.messages), p.tools, p.metadata)


def tools_as_system(p: Prompt) -> Prompt:
    """Tool schemas written into the system message as text, for formats whose chat template
    has no tool prompt (the way the SmolLM2 ground truth shows BFCL functions)."""
    if not p.tools:
        return p
    text = TOOLS_SYSTEM.format(tools=json.dumps(list(p.tools), ensure_ascii=False))
    msgs = list(p.messages)
    if msgs and msgs[0].role == "system":
        msgs[0] = Message("system", (msgs[0].content or "") + "\n\n" + text)
    else:
        msgs.insert(0, Message("system", text))
    return Prompt(p.id, p.dataset, tuple(msgs), (), {**p.metadata, "tools_in_system": True})


def sample_seed(base: int, prompt_id: str, sample_idx: int, turn: int) -> int:
    h = hashlib.sha256(f"{base}:{prompt_id}:{sample_idx}:{turn}".encode()).hexdigest()
    return int(h[:8], 16)
