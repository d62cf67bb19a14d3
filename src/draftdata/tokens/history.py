"""Conversations as the model answers them: which turns a prompt has, and the messages each turn
is answered with (on-policy: earlier answers are the model's own). Generation asks these turns;
the run's tokens stage (``tokens.run_samples``) rebuilds them from the stored answers."""

from __future__ import annotations

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


def stand_in_answers(p: Prompt, turns: int) -> list[Message]:
    """The model's answers before each of ``turns`` turns, where none is given yet: the
    dataset's own assistant messages, then empty ones (``plan`` and the serving contract render
    later on-policy turns with them; the run uses the model's real answers)."""
    answers = [x for x in p.messages if x.role == "assistant"]
    return answers + [Message("assistant", "")] * max(0, turns - len(answers))


def answer_message(view: ApiView) -> Message:
    return Message(
        "assistant", view.content or "", reasoning=view.reasoning, tool_calls=view.tool_calls
    )
