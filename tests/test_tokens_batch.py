"""The tokens stage batched: one encode call per window of records, the same ids as one record
at a time, a bad answer dropped in its place, and Arrow columns built without the generic path."""

from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
import pytest

from conftest import GROUNDTRUTH
from draftdata.errors import ReconstructError
from draftdata.records import ApiView, Key, Message
from draftdata.records.arrow import SAMPLES_SCHEMA, SHARD_SCHEMA, sample_row, shard_row, table_of
from draftdata.records.wire import messages_of, view_from_record
from draftdata.tokens.reconstruct import Item
from draftdata.tokens.target import Target


def gt_items(n: int) -> list[tuple[Item, list[int]]]:
    out = []
    for line in GROUNDTRUTH.read_text().splitlines()[:n]:
        r = json.loads(line)
        item = Item(messages_of(r["messages"]), view_from_record(r), record_id=r["id"])
        out.append((item, r["prompt_ids"] + r["output_ids"]))
    return out


class Calls:
    """Counts the tokenizer's encode calls (the instance's methods wrapped in place)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tok) -> None:  # type: ignore[no-untyped-def]
        self.batch = self.single = 0
        batch, single = tok.encode_batch, tok.encode

        def encode_batch(texts):  # type: ignore[no-untyped-def]
            self.batch += 1
            return batch(texts)

        def encode(text):  # type: ignore[no-untyped-def]
            self.single += 1
            return single(text)

        monkeypatch.setattr(tok, "encode_batch", encode_batch)
        monkeypatch.setattr(tok, "encode", encode)


def test_a_window_of_records_is_one_encode_call(bound, monkeypatch):
    b = bound("smollm2")
    pairs = gt_items(120)
    items = [i for i, _ in pairs]
    assert sum(i.view.finish_reason == "length" for i in items) >= 10  # open-ended ones too
    one_by_one = [next(Target(b).reconstruct_many([i])) for i in items]
    calls = Calls(monkeypatch, b.tokenizer)
    batched = list(Target(b).reconstruct_many(items, window=64))
    # two windows, each one batched call and one more for the cut answers whose probe merged
    # into their last token; no per-text encode (the old path encoded every piece of every
    # record on its own, and each cut answer twice)
    assert (calls.batch, calls.single) == (4, 0)
    assert batched == one_by_one
    # and the ids are the engine's for the records text can express (the dev file's known
    # ceiling is 87.6% exact)
    exact = sum(s.input_ids == truth for s, (_, truth) in zip(batched, pairs, strict=True))
    assert exact / len(pairs) >= 0.85


def test_a_bad_answer_is_dropped_in_its_place(bound):
    b = bound("smollm2")
    msgs = (Message("user", "hi"),)
    items = [
        Item(msgs, ApiView("one", "stop"), record_id="a"),
        Item(msgs, ApiView("two", "stop", reasoning="thought"), record_id="b"),
        Item(msgs, ApiView("three", "length"), record_id="c"),
    ]
    got = list(Target(b).reconstruct_many(items))
    assert [type(g).__name__ for g in got] == ["Sample", "ReconstructError", "Sample"]
    assert isinstance(got[1], ReconstructError)
    assert got[1].reason == "reasoning_without_think_grammar"
    assert [g.id for g in (got[0], got[2])] == ["a", "c"]
    tok = b.tokenizer
    assert got[2].response_ids == tok.encode("three")  # cut answer: no end of turn


def test_arrow_columns_match_the_generic_conversion(bound):
    b = bound("smollm2")
    samples = [s for s in Target(b).reconstruct_many([i for i, _ in gt_items(40)])]
    rows = [sample_row(s) for s in samples]
    # the shapes real rows take besides: warnings, a missing text, non-ASCII text
    rows[1] = {**rows[1], "warnings": ["prompt_drift", "logprob_fallback:é"], "dataset": None}
    rows[2] = {**rows[2], "id": "ünï/2", "finish_reason": "length"}
    assert table_of(rows, SAMPLES_SCHEMA).equals(pa.Table.from_pylist(rows, schema=SAMPLES_SCHEMA))
    keyed = [
        shard_row(replace(s, key=Key("d", f"p{i}", 0, 0)), {"i": i}) for i, s in enumerate(samples)
    ]
    assert table_of(keyed, SHARD_SCHEMA).equals(pa.Table.from_pylist(keyed, schema=SHARD_SCHEMA))
