"""Segments become ids through one encoder (``Target.encoder``), used two ways that must agree
id for id.

``Target.encode`` encodes one sequence. ``Target.reconstruct_many`` encodes the pieces of a
whole window of records in one batched call, each distinct piece once, on a thread while the
window before is assembled; it encodes a truncated answer's last piece open-ended; and one piece
the tokenizer cannot keep as text fails only its own record. Here the window is checked against
one sequence at a time on the whole ShareGPT input of
``benchmarks/reconstruct_floor.py`` (its first 1,000 conversations, the last assistant turn as
the answer), under Qwen3's and Llama 3's tokenizers."""

from __future__ import annotations

import json

import pytest

from conftest import PROMPTS
from draftdata.records import ApiView, Message
from draftdata.records.wire import messages_of, view_from_record
from draftdata.tokens.reconstruct import Item
from draftdata.tokens.response import answer_segments
from draftdata.tokens.target import Target

SHAREGPT = PROMPTS / "sharegpt_v3_first1000.json"
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def sharegpt() -> list[tuple[str, tuple[Message, ...], ApiView]]:
    """The benchmark's ShareGPT cases: (id, conversation before the last answer, the answer)."""
    out = []
    for conv in json.loads(SHAREGPT.read_text()):
        msgs = [
            {"role": ROLES[t["from"]], "content": t["value"]}
            for t in conv["conversations"]
            if t.get("from") in ROLES
        ]
        while msgs and msgs[-1]["role"] != "assistant":
            msgs.pop()
        if len(msgs) < 2 or not msgs[-1]["content"]:
            continue
        *history, last = msgs
        view = view_from_record({"api_view": {"content": last["content"], "finish_reason": "stop"}})
        assert view is not None
        out.append((conv["id"], messages_of(history), view))
    return out


@pytest.mark.parametrize("key", ["qwen3", "llama3"])
def test_reconstruction_encodes_what_one_sequence_encodes(bound, key):
    target = Target(bound(key))
    cases = sharegpt()
    assert len(cases) > 900  # the whole input, not a sample of it
    prompts = [target.format.render_prompt(m, ()) for _, m, _ in cases]
    answers = [answer_segments(target, m, v)[0] for _, m, v in cases]
    want_prompts = [target.encode(p)[0] for p in prompts]
    want_answers = [target.encode(a)[0] for a in answers]

    got = target.prompt_ids_many([(m, ()) for _, m, _ in cases])
    assert got == want_prompts

    items = [Item(m, v, record_id=i) for i, m, v in cases]
    samples = list(target.reconstruct_many(items))
    assert [type(s).__name__ for s in samples] == ["Sample"] * len(cases)
    bad = []
    for s, p, a in zip(samples, want_prompts, want_answers, strict=True):
        if (s.input_ids, s.loss_mask, s.prompt_len) != (
            p + a,
            [False] * len(p) + [True] * len(a),
            len(p),
        ):
            bad.append(s.id)
    assert bad == []
