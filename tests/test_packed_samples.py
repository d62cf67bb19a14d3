"""Samples kept as arrays (``reconstruct_many(packed=True)``, what ``reconstruct -o X.parquet``
writes from): the ids are those of a reference built in the test from the tokenizer's own
``encode``, piece by piece (``test_segments_path.ref_encode``). For Kimi K2 the window is large
enough that the pieces go through gigatoken's arrays, and the reference's short texts through
tiktoken: two encoders. Every other kind of sample (all turns, split preferences, engine ids, a
prompt the server rendered otherwise) is the list path's sample exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import PROMPTS, TOKENIZERS
from draftdata.records import ApiView, PackedSample
from draftdata.tokenizers.fast_tiktoken import FAST_MIN_CHARS
from draftdata.tokens.reconstruct import Item
from draftdata.tokens.response import answer_segments
from draftdata.tokens.target import Target
from shared import run
from test_encode_paths import sharegpt
from test_segments_path import ref_encode


def items(n: int, reasoning: bool) -> list[Item]:
    """Answers as a server returns them: every fourth cut by max_tokens mid-text, every third
    with reasoning (the previous turn's text) where the format has a think grammar."""
    out = []
    for i, (_, history, whole) in enumerate(sharegpt()[:n]):
        answer = whole.content or ""
        cut = i % 4 == 1
        view = ApiView(
            answer[: len(answer) * 2 // 3] if cut else answer,
            "length" if cut else "stop",
            reasoning=(history[-1].content or "")[:400] if reasoning and i % 3 == 0 else None,
        )
        out.append(Item(history, view, record_id=str(i)))
    return out


@pytest.mark.parametrize("key", ["kimi-k2", "smollm2"])
def test_packed_samples_are_the_piece_by_piece_reference(bound, key, monkeypatch):
    b = bound(key)
    todo = items(200, reasoning=b.format.think is not None)
    chars = sum(len(m.content or "") for it in todo for m in it.messages)
    assert chars + sum(len(it.view.content or "") for it in todo) > 2 * FAST_MIN_CHARS
    arrays: list[bool] = []
    tok = b.tokenizer
    own = tok.encode_batch_arrays

    def spy(texts):  # type: ignore[no-untyped-def]
        got = own(texts)
        arrays.append(got is not None)
        return got

    monkeypatch.setattr(tok, "encode_batch_arrays", spy)
    got = list(Target(b).reconstruct_many(todo, packed=True))
    # Kimi's window goes through gigatoken's arrays (a few cut answers encoded again, a small
    # batch, through tiktoken's lists); SmolLM2's tokenizer has no array path
    assert arrays[0] == (key == "kimi-k2") and any(arrays) == (key == "kimi-k2")
    assert sum(it.view.finish_reason == "length" for it in todo) >= 40
    for it, s in zip(todo, got, strict=True):
        assert isinstance(s, PackedSample), s
        assert s.input_ids.dtype == np.int32 and s.loss_mask.dtype == np.bool_
        prompt_ids, _ = ref_encode(b, b.format.render_prompt(it.messages, ()))
        segs, _ = answer_segments(Target(b), it.messages, it.view)
        answer_ids, _ = ref_encode(b, segs, it.view.finish_reason == "length")
        assert s.input_ids.tolist() == prompt_ids + answer_ids, it.record_id
        assert s.prompt_len == len(prompt_ids)
        assert s.loss_mask.tolist() == [False] * len(prompt_ids) + [True] * len(answer_ids)
    listed = [s.sample() for s in got]  # type: ignore[union-attr]
    assert listed == list(Target(b).reconstruct_many(todo))


def test_every_other_kind_of_sample_packs_as_the_list_path_gives_it(bound):
    """All turns in one sequence, split preferences, an engine's own ids, and a prompt the server
    rendered otherwise than we do (``prompt_drift``)."""
    b = bound("smollm2")
    base = items(12, reasoning=False)
    ids_of = b.tokenizer.encode
    todo = [
        *[replace(it, all_turns=True) for it in base[:4]],
        *[
            replace(it, output_ids=tuple(ids_of(it.view.content or "")), record_id=f"e{k}")
            for k, it in enumerate(base[4:8])
        ],
        *[
            replace(it, server_prompt_ids=(1, 2, 3), record_id=f"d{k}")
            for k, it in enumerate(base[8:])
        ],
    ]

    def text_ids(text: str, ids: list[int]) -> list[int]:
        return ids[::-1]  # not the same bytes: a rewrite the output must show

    for prefs in (None, text_ids):
        want = list(Target(b, prefs=prefs).reconstruct_many(todo))
        got = list(Target(b, prefs=prefs).reconstruct_many(todo, packed=True))
        assert [s.sample() for s in got] == want  # type: ignore[union-attr]
    sources = [s.token_source for s in want]  # type: ignore[union-attr]
    assert sources.count("engine") == 4
    assert sum("prompt_drift" in s.warnings for s in want) == 4  # type: ignore[union-attr]
    assert sum(s.loss_mask[0] is False and s.loss_mask.count(True) > 0 for s in want) == 12  # type: ignore[union-attr]


def test_reconstruct_to_parquet_over_two_processes_is_the_jsonl_lists(tmp_path):
    """Kimi's answers to Parquet over two processes (arrays from gigatoken in workers that never
    import awkward) and in one (arrays, awkward imported), against JSON lines written from the
    lists: the same rows."""
    src = tmp_path / "in.jsonl"
    recs = [
        {
            "id": it.record_id,
            "messages": [{"role": m.role, "content": m.content} for m in it.messages],
            "api_view": {"content": it.view.content, "finish_reason": it.view.finish_reason},
        }
        for it in items(600, reasoning=False)
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tok = ["-t", str(TOKENIZERS / "kimi-k2"), "-f", "kimi-k2"]
    rows = {}
    for name, jobs in (("two.parquet", "2"), ("one.parquet", "1"), ("one.jsonl", "1")):
        out = tmp_path / name
        r = run("reconstruct", str(src), *tok, "-o", str(out), "--jobs", jobs)
        assert r.returncode == 0, r.stderr
        if out.suffix == ".parquet":
            rows[name] = pq.read_table(out).to_pylist()
        else:
            rows[name] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows["one.jsonl"]) == 600
    assert rows["two.parquet"] == rows["one.parquet"] == rows["one.jsonl"]


_WORKER = """
import sys
from draftdata.tokenizers import load_tokenizer
from draftdata.tokens import pool

def work(texts):
    tok = load_tokenizer(sys.argv[1])
    arrays = tok.encode_batch_arrays(texts)
    blocked = sys.modules.get("awkward", 0) is None
    return [a.tolist() for a in arrays], tok.encode_batch(texts), blocked

texts = [open(p, encoding="utf-8").read() for p in sys.argv[2:]] * 3
[(arrays, lists, blocked)] = pool.ordered(work, [(texts,)], 1)
print(arrays == lists, blocked, "awkward" in sys.modules)
"""


def test_a_pool_worker_encodes_arrays_without_importing_awkward(tmp_path):
    """gigatoken imports awkward (0.12 s) at a batch call only to ask whether its input is one;
    a pool worker marks it unimportable, and gigatoken's arrays still hold tiktoken's ids (the
    corpus check at load compares them too). The parent is left as it was."""
    files = [str(PROMPTS / "mt_bench_question.jsonl"), str(PROMPTS / "writingbench_200.jsonl")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run(
        [sys.executable, "-c", _WORKER, str(TOKENIZERS / "kimi-k2"), *files],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "False"]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_sample_file_takes_lists_and_arrays_side_by_side(bound, tmp_path, suffix):
    """A library user may add both kinds to one file (an all-turns sample, whose mask is not
    one run, among them): each row reads back as the list path wrote it."""
    from draftdata.export.shards import read_samples, write_samples

    b = bound("smollm2")
    todo = [replace(it, all_turns=k == 1) for k, it in enumerate(items(4, reasoning=False))]
    want = list(Target(b).reconstruct_many(todo))
    packed = list(Target(b).reconstruct_many(todo, packed=True))
    mixed = [p if k % 2 else s for k, (s, p) in enumerate(zip(want, packed, strict=True))]
    assert {type(x) for x in mixed} == {type(want[0]), PackedSample}
    path = tmp_path / f"mixed{suffix}"
    assert write_samples(mixed, path) == 4
    _, back = read_samples(path)
    assert back == want
