"""measure.contamination: MT-Bench prompts inside training records are flagged, unrelated ShareGPT
prompts are not (the figures in benchmarks/contamination.py), user JSONL sets, short prompts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import PROMPTS, SHARED
from draftdata.errors import InputError
from draftdata.measure.contamination import (
    BUILTIN_SETS,
    DEFAULT_N,
    DEFAULT_THRESHOLD,
    Detector,
    EvalPrompt,
    EvalSet,
    normalize,
)
from draftdata.records import Message
from draftdata.sources import make_prompt, read_prompts

#: MT-Bench turns with fewer than 8 words: matched only when they are the whole message
SHORT_TURNS = {"95.2", "99.2", "116.2", "117.2", "120.2", "121.2", "145.2"}


@pytest.fixture(scope="module")
def mt() -> EvalSet:
    return EvalSet.builtin("mt-bench", SHARED)


@pytest.fixture(scope="module")
def he() -> EvalSet:
    return EvalSet.builtin("humaneval", SHARED)


@pytest.fixture(scope="module")
def first_turns() -> list[str]:
    prompts, skipped = read_prompts(PROMPTS / "sharegpt_v3_first1000.json", "sharegpt", "sg")
    assert len(prompts) == 976, skipped  # 24 of 1,000 have no usable user turn or repeat one
    return [next(m.content for m in p.messages if m.role == "user" and m.content) for p in prompts]


def test_builtin_sets(mt: EvalSet, he: EvalSet) -> None:
    assert BUILTIN_SETS == ("mt-bench", "humaneval")
    assert len(mt.prompts) == 160 and mt.prompts[0].id == "81.1" and mt.prompts[1].id == "81.2"
    assert len(he.prompts) == 164 and he.prompts[0].id == "HumanEval/0"
    assert he.prompts[0].text.startswith("from typing import List")  # no instruction added
    assert Detector([mt]).short_prompts == len(SHORT_TURNS)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda t: t,
        lambda t: "Hi! I have a question for you. " + t + "\nPlease answer step by step, thanks.",
        lambda t: "I'm preparing for an interview tomorrow and a friend sent me this:\n\n" + t,
        lambda t: t.upper().replace("\n", "  "),
    ],
    ids=["verbatim", "wrapped", "prefixed", "reformatted"],
)
def test_mtbench_turns_inside_training_text_are_flagged(
    mt: EvalSet, wrap: Callable[[str], str]
) -> None:
    det = Detector([mt])
    verbatim = wrap("x") == "x"
    missed = set()
    for p in mt.prompts:
        m = det.check(wrap(p.text))
        if m is None or m.eval_id != p.id:
            missed.add(p.id)
        else:
            assert m.eval_set == "mt-bench" and m.flagged
            assert m.score == 1.0 and (m.rule == "exact") == (p.id in SHORT_TURNS)
    # all 160 verbatim; embedded: all 80 first turns and 73 second turns (the short ones only
    # match as the whole message, so "Can you parallelize it?" in passing is not flagged)
    assert missed == (set() if verbatim or wrap("a b") == "A B" else SHORT_TURNS)


def test_mtbench_in_a_real_sharegpt_message_and_in_records(
    mt: EvalSet, first_turns: list[str]
) -> None:
    det = Detector([mt])
    flagged = 0
    for i in range(0, len(mt.prompts), 2):
        t1, t2 = mt.prompts[i], mt.prompts[i + 1]
        spliced = first_turns[i] + "\n\n" + t1.text  # pasted after a real, long user message
        m = det.check(spliced)
        assert m is not None and m.eval_id == t1.id
        record = make_prompt(
            "train",
            (
                Message("system", "You are a helpful assistant."),
                Message("user", "Question: " + t1.text),
                Message("assistant", "Here is my answer."),
                Message("user", t2.text + " Thanks!"),
            ),
        )
        flagged += det.check_prompt(record) is not None
    assert flagged == 80
    # both turns match fully; the tie goes to the prompt with more n-grams (turn 2 here)
    assert [(p.id, m.eval_id) for p, m in det.scan([record])] == [(record.id, "160.2")]


def test_sharegpt_first_turns_are_not_flagged(
    mt: EvalSet, he: EvalSet, first_turns: list[str]
) -> None:
    """The false-positive figure: 0 of 976 ShareGPT first turns at n=8, threshold 0.7 against
    either set; none even shares one 8-gram. At n=4 some do, and the highest score (2 of 7
    4-grams of MT-Bench 97.2) is far below the threshold."""
    for es in (mt, he):
        det = Detector([es], n=DEFAULT_N, threshold=DEFAULT_THRESHOLD)
        assert [t for t in first_turns if det.check(t) is not None] == []
        assert [t for t in first_turns if det.best(t) is not None] == []
    loose = Detector([mt, he], n=4)
    best = [m for t in first_turns if (m := loose.best(t)) is not None]
    assert len(best) == 98 and not any(m.flagged for m in best)
    top = max(best, key=lambda m: m.score)
    assert (top.eval_id, top.found, top.total) == ("97.2", 2, 7)


def test_score_is_the_eval_prompts_share_of_ngrams() -> None:
    text = " ".join(f"w{i}" for i in range(20))  # 20 words: 13 distinct 8-grams
    det = Detector([EvalSet("mine", (EvalPrompt("a", text),))])
    edited = text.replace("w10", "changed")  # kills the 8 n-grams that start at w3..w10
    m = det.best(edited)
    assert m is not None and (m.found, m.total, m.flagged) == (5, 13, False)
    assert m.score == pytest.approx(5 / 13)
    edited = text.replace("w19", "changed")  # only the last n-gram lost: 12/13 passes 0.7
    m = det.check("lots of unrelated words before it " + edited)
    assert m is not None and (m.found, m.total) == (12, 13)
    assert Detector(det.eval_sets, threshold=0.95).check(edited) is None


def test_short_prompts_match_whole_messages_only() -> None:
    es = EvalSet("tiny", (EvalPrompt("p", "Prove the Pythagorean theorem."),))
    det = Detector([es])
    m = det.check("  prove the PYTHAGOREAN theorem!! ")
    assert m is not None and (m.eval_id, m.rule, m.score) == ("p", "exact", 1.0)
    assert det.check("Please prove the Pythagorean theorem.") is None
    assert det.check("") is None and det.best("?!") is None
    # a smaller n turns it into an n-gram prompt that is found inside longer text
    m = Detector([es], n=2).check("Please prove the Pythagorean theorem, briefly.")
    assert m is not None and m.rule == "ngram" and m.found == m.total == 3


def test_normalize() -> None:
    assert normalize("def has_close_elements(numbers: List[float]) -> bool:\n") == (
        "def has close elements numbers list float bool"
    )
    assert normalize("Ｆｕｌｌ‐width  ÉTÉ") == "full width été"


def test_user_jsonl_set(tmp_path: Path) -> None:
    rows = [
        {
            "id": "g1",
            "question": "Natalia sold clips to 48 of her friends in April, and then "
            "she sold half as many clips in May. How many clips did Natalia sell altogether?",
        },
        {"prompt": "Write a haiku about the sea at night, with the moon in it."},
        {"text": "Summarize the plot of Hamlet in exactly three sentences, please."},
        {
            "id": "c",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name three prime numbers larger than one hundred."},
                {"role": "assistant", "content": "101, 103, 107."},
                {"role": "user", "content": "Now name the three that follow them, in order."},
            ],
        },
        {"answer": "no prompt here"},
        {"messages": [{"role": "wizard", "content": "x"}]},
    ]
    path = tmp_path / "gsm8k_mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    es = EvalSet.from_jsonl(path)
    assert es.name == "gsm8k_mine"
    assert [p.id for p in es.prompts] == ["g1", "2", "3", "c.1", "c.2"]
    assert es.skipped == {"no_prompt_text_or_messages": 1, "bad_message": 1, "malformed_json": 1}
    det = Detector([es])
    record = make_prompt(
        "train",
        (
            Message("user", "hey"),
            Message("assistant", "hi"),
            Message(
                "user",
                "Solve: natalia sold clips to 48 of her friends in april, and then she "
                "sold half as many clips in may. how many clips did natalia sell altogether",
            ),
        ),
    )
    m = det.check_prompt(record)
    assert m is not None and (m.eval_set, m.eval_id, m.score) == ("gsm8k_mine", "g1", 1.0)
    assert det.check("Now name the three that follow them, in order, and explain.") is not None


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown evaluation set 'gsm8k'"):
        EvalSet.builtin("gsm8k", SHARED)
    with pytest.raises(InputError, match="DRAFTDATA_SHARED"):
        EvalSet.builtin("mt-bench", tmp_path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"answer": 1}\n')
    with pytest.raises(InputError, match="holds no prompts"):
        EvalSet.from_jsonl(empty)
    es = EvalSet("x", (EvalPrompt("a", "one two"),))
    for kw in ({"n": 0}, {"threshold": 0.0}, {"threshold": 1.5}):
        with pytest.raises(InputError):
            Detector([es], **kw)
    with pytest.raises(InputError, match="no evaluation sets"):
        Detector([])
