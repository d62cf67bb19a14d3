"""Conversations as the model answers them: which turns a prompt has, the messages each turn is
answered with (on-policy: earlier answers are the model's own), tool schemas written into the
system prompt for formats without a tool prompt, and each request's sampling seed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from ..errors import GenerateError
from ..records import ApiView, Message, Prompt


def user_turns(p: Prompt) -> list[int]:
    """Indices of the user messages of a prompt (each one a turn to answer)."""
    return [i for i, m in enumerate(p.messages) if m.role == "user"]


#: the turns modes asked on-policy, every user turn answered given the model's own answers
ON_POLICY = ("all", "joined")


def n_turns(p: Prompt, mode: str) -> int:
    return len(user_turns(p)) if mode in ON_POLICY else 1


def turn_messages(
    p: Prompt, mode: str, turn: int, answers: Sequence[Message]
) -> tuple[Message, ...]:
    """The conversation the model answers at ``turn``: with ``all`` (and ``joined``), earlier
    assistant turns are the model's own ``answers``; with ``last``, the dataset's conversation up to its last user
    message; with ``first``, up to the first user message."""
    ut = user_turns(p)
    if not ut:
        raise GenerateError(f"prompt {p.id} of {p.dataset} has no user message")
    if mode == "first":
        return p.messages[: ut[0] + 1]
    if mode == "last":
        return p.messages[: ut[-1] + 1]
    head = list(p.messages[: ut[0]])  # system messages
    for t in range(turn + 1):
        end = ut[t + 1] if t + 1 < len(ut) else len(p.messages)
        # this turn's user message and any tool results after it, but not dataset answers
        head += [m for m in p.messages[ut[t] : end] if m.role != "assistant"]
        if t < turn:
            head.append(answers[t])
    return tuple(head)


TOOLS_SYSTEM = (
    "You can call these functions: {tools}\nTo call functions, answer with a JSON object "
    '{{"name": ..., "arguments": {{...}}}} or a JSON list of such objects.'
)


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


def answer_message(view: ApiView) -> Message:
    return Message(
        "assistant", view.content or "", reasoning=view.reasoning, tool_calls=view.tool_calls
    )


def sample_seed(base: int, prompt_id: str, sample_idx: int, turn: int) -> int:
    h = hashlib.sha256(f"{base}:{prompt_id}:{sample_idx}:{turn}".encode()).hexdigest()
    return int(h[:8], 16)
