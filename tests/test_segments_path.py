"""Segments become ids by one path, the target's encoder (``Target.encoder``): ``encode`` (one
sequence), reconstruction (a window of records) and repair (the rest of a run, ``piece_ids``)
all use it.

Checked here against a reference written in the test from the tokenizer's own ``encode``, piece
by piece: adjacent text with the same trained flag joined, empty text dropped, each marker its
verified id, a truncated answer's last text encoded as the prefix of ``text + "a"`` (the plain
encoding where the ``a`` merged into the last token)."""

from __future__ import annotations

import json

from conftest import GROUNDTRUTH
from draftdata.formats import Special, Text
from draftdata.records.wire import messages_of, view_from_record
from draftdata.tokens.reconstruct import Item
from draftdata.tokens.response import answer_segments
from draftdata.tokens.target import Target


def ref_piece(tok, text: str, open_end: bool) -> list[int]:  # type: ignore[no-untyped-def]
    if not open_end:
        return tok.encode(text)
    ids = tok.encode(text + "a")
    return ids[:-1] if tok.token_bytes(ids[-1]) == b"a" else tok.encode(text)


def ref_encode(bound, segs, open_end_last: bool = False, text_ids=None):  # type: ignore[no-untyped-def]
    joined: list[Text | Special] = []
    for s in segs:
        if isinstance(s, Text) and not s.text:
            continue
        last = joined[-1] if joined else None
        if isinstance(s, Text) and isinstance(last, Text) and last.trained == s.trained:
            joined[-1] = Text(last.text + s.text, s.trained)
            continue
        joined.append(s)
    ids: list[int] = []
    mask: list[bool] = []
    for i, s in enumerate(joined):
        if isinstance(s, Special):
            piece = [bound.ids[s.marker]]
        else:
            last = open_end_last and i == len(joined) - 1
            piece = ref_piece(bound.tokenizer, s.text, last)
            if text_ids is not None and s.trained:
                piece = text_ids(s.text, piece)
        ids += piece
        mask += [s.trained] * len(piece)
    return ids, mask


def gt_cases(n: int):  # type: ignore[no-untyped-def]
    for line in GROUNDTRUTH.read_text().splitlines()[:n]:
        r = json.loads(line)
        yield r["id"], messages_of(r["messages"]), view_from_record(r)


def test_every_caller_encodes_as_the_piece_by_piece_reference(bound):
    b = bound("smollm2")
    target = Target(b)
    cases = list(gt_cases(160))
    assert sum(v.finish_reason == "length" for _, _, v in cases) >= 10  # open-ended ones too
    items = [Item(m, v, record_id=i) for i, m, v in cases]
    samples = list(Target(b).reconstruct_many(items, window=64))
    bad = []
    for (rid, msgs, view), s in zip(cases, samples, strict=True):
        prompt = b.format.render_prompt(msgs, ())
        answer, _ = answer_segments(target, msgs, view)
        p_ids, p_mask = ref_encode(b, prompt)
        a_ids, _ = ref_encode(b, answer, view.finish_reason == "length")
        assert target.encode(prompt) == (p_ids, p_mask)
        assert target.prompt_ids(msgs) == p_ids
        assert target.response_ids(answer, view.finish_reason) == a_ids
        if view.finish_reason != "length":
            assert target.encode(answer) == ref_encode(b, answer)
        if (s.input_ids, s.prompt_len) != (p_ids + a_ids, len(p_ids)):
            bad.append(rid)
        # the repair's rest of a run: one trained piece
        text = view.content or ""
        for open_end in (False, True):
            assert target.piece_ids(text, open_end) == ref_piece(b.tokenizer, text, open_end)
    assert bad == []


def test_split_preferences_rewrite_the_trained_text_only(bound):
    b = bound("qwen3")
    eot = b.format.end_of_turn
    seen: list[str] = []

    def text_ids(text: str, ids: list[int]) -> list[int]:
        seen.append(text)
        return ids[::-1]

    segs = [
        Text("You are kind.\n"),
        Special(eot),
        Text(" Hello there, friend", trained=True),
        Text("!", trained=True),
        Special(eot, trained=True),
    ]
    target = Target(b, prefs=text_ids)
    got = target.encode(segs)
    assert seen == [" Hello there, friend!"]
    assert got == ref_encode(b, segs, text_ids=lambda t, ids: ids[::-1])
    assert target.piece_ids(" Hi there", True) == ref_piece(b.tokenizer, " Hi there", True)[::-1]
    # the prompt is never trained: no preference touches it; the canonical target has none
    assert target.prompt_ids([]) == Target(b).prompt_ids([])
    assert target.canonical.encode(segs) == ref_encode(b, segs)
