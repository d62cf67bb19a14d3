"""Every assistant turn trained in one sequence (`reconstruct --all-turns`). The expected ids and
trained spans come from the model's own chat template (transformers' renderer), never from
draftdata's formats: turn k's span starts where the template's rendering of the conversation
before it, with the generation prompt, ends, and runs to its end-of-turn marker."""

from __future__ import annotations

import itertools
import json

import pyarrow.parquet as pq
import pytest

from conftest import PROMPTS, REAL
from draftdata.records import ApiView
from draftdata.records.wire import messages_of
from draftdata.tokens.reconstruct import Item
from draftdata.tokens.target import Target
from oracle import oracle_ids
from shared import kwargs, run

ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def conversations(n: int) -> list[list[dict]]:
    out = []
    for c in json.loads((PROMPTS / "sharegpt_v3_first1000.json").read_text()):
        msgs = [
            {"role": ROLES[t["from"]], "content": t["value"]}
            for t in c["conversations"]
            if t.get("from") in ROLES
        ]
        while msgs and msgs[-1]["role"] != "assistant":
            msgs.pop()
        if (
            msgs
            and msgs[0]["role"] == "user"
            and 2 <= sum(m["role"] == "assistant" for m in msgs) <= 4
            and all(m["content"] for m in msgs)
        ):
            out.append(msgs)
        if len(out) == n:
            break
    return out


def expected(tok, template: str, msgs: list[dict], end_id: int) -> tuple[list[int], list[bool]]:
    """The template's ids of the whole conversation, and True from where each answer's prompt
    ends through the answer's end-of-turn id."""
    kw = kwargs(tok)
    ids = oracle_ids(tok, template, msgs, add_generation_prompt=False, **kw)
    mask = [False] * len(ids)
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start = len(oracle_ids(tok, template, msgs[:k], add_generation_prompt=True, **kw))
        end = ids.index(end_id, start) + 1
        mask[start:end] = [True] * (end - start)
    return ids, mask


@pytest.mark.parametrize("key", ["smollm2", "llama3"])
def test_every_turn_is_trained_where_the_template_puts_it(bound, key):
    b = bound(key)
    template = b.tokenizer.chat_template
    items, want = [], []
    for i, msgs in enumerate(conversations(4)):
        *history, last = msgs
        view = ApiView(last["content"], "stop")
        items.append(Item(messages_of(history), view, record_id=str(i), all_turns=True))
        want.append(expected(b.tokenizer, template, msgs, b.end_id))
    got = list(Target(b).reconstruct_many(items))
    for s, (ids, mask) in zip(got, want, strict=True):
        n = len(s.input_ids)
        assert ids[:n] == s.input_ids  # the template may add text after the last end of turn
        assert mask[:n] == s.loss_mask
        assert sum(1 for a, b2 in itertools.pairwise(mask) if b2 and not a) >= 2  # several spans
        assert s.prompt_len == mask.index(True)


def test_a_format_that_rewrites_history_is_refused_per_record(bound):
    """Qwen3's generation prompt opens an empty think block its history does not show."""
    b = bound("qwen3")
    *history, last = conversations(1)[0]
    (got,) = Target(b).reconstruct_many(
        [Item(messages_of(history), ApiView(last["content"], "stop"), all_turns=True)]
    )
    assert getattr(got, "reason", None) == "history_not_verbatim"


def test_cli_all_turns_writes_one_row_per_conversation(tmp_path):
    spec, fmt, _ = REAL["smollm2"]
    src = tmp_path / "in.jsonl"
    convs = conversations(4)
    src.write_text(
        "".join(
            json.dumps({"id": i, "messages": m[:-1], "api_view": {"content": m[-1]["content"]}})
            + "\n"
            for i, m in enumerate(convs)
        )
    )
    out = tmp_path / "out.parquet"
    r = run("reconstruct", str(src), "-t", spec, "-f", fmt, "--all-turns", "-o", str(out))
    assert r.returncode == 0, r.stderr
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == len(convs)
    for row, m in zip(rows, convs, strict=True):
        spans = sum(1 for a, b in itertools.pairwise(row["loss_mask"]) if b and not a)
        assert spans + row["loss_mask"][0] == sum(x["role"] == "assistant" for x in m)
