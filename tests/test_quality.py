"""The quality checks (tokens/quality.py): a hand-made answer each check must flag and one it
must not, the loop rule kept off legitimately repetitive answers, and the figures the module
docstring gives for the SmolLM2 dev ground truth."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from conftest import GROUNDTRUTH
from draftdata.records import ApiView, Message, Provenance, Sample
from draftdata.tokens.quality import (
    QUALITY_CHECKS,
    AnswerIndex,
    Markers,
    check_answer,
    check_sample,
    empty_answer,
    language_mismatch,
    normalise,
    repeated_tail,
    repetition_loop,
    think_unclosed,
    truncated,
)
from draftdata.tokens.target import Target

PROV = Provenance("0" * 64, "qwen3", "1", "test")


@pytest.fixture(scope="module")
def smol(bound):
    return bound("smollm2")


def loop_of(b, text: str):
    return repetition_loop(b.tokenizer.encode(text))


# --- repetition_loop --------------------------------------------------------------------------


def test_loop_fires_on_a_greedy_loop_cut_at_max_tokens(smol) -> None:
    text = "Here is the plan.\n\n" + "The product is a product that can be sold to clients. " * 30
    ids = smol.tokenizer.encode(text)[:200]  # cut mid-block, as max_tokens cuts
    loop = repetition_loop(ids)
    assert loop is not None and loop.repeats >= 2 and loop.length >= 0.5 * len(ids)
    assert "repetition_loop" in check_answer(ids, "length")


def test_loop_fires_on_a_loop_that_ended_with_the_stop_id(smol) -> None:
    body = "def f(x):\n    return f(x) * 10\n" * 6
    ids = [*smol.tokenizer.encode("Sure:\n" + body), smol.end_id]
    assert "repetition_loop" in check_answer(ids, "stop", markers=Markers(smol.stop_ids))
    # without the stop id taken off, the tail is not periodic: the caller must pass it
    assert "repetition_loop" not in check_answer(ids, "stop")


def test_repeated_tail_counts_a_partial_first_block() -> None:
    assert repeated_tail([9, 1, 2, 3, 1, 2, 3, 1], 3) == 7
    assert repeated_tail([1, 2, 3], 5) == 3
    assert repeated_tail([1, 2, 3, 4], 2) == 2  # the block itself, no repeat


MARKDOWN_TABLE = "| Day | Task | Done |\n|---|---|---|\n" + "".join(
    f"| {d} | {t} | {'yes' if i % 2 else 'no'} |\n"
    for i, (d, t) in enumerate(
        [
            ("Monday", "Write the report"),
            ("Tuesday", "Review the report"),
            ("Wednesday", "Send the report"),
            ("Thursday", "Plan the next week"),
            ("Friday", "Write the summary"),
            ("Saturday", "Rest"),
            ("Sunday", "Rest"),
        ]
        * 2
    )
)
NUMBERS = "Here are the numbers from 1 to 50:\n\n" + ", ".join(str(i) for i in range(1, 51))
NUMBERED = "Steps:\n" + "".join(
    f"{i}. **Step {i}**: Add the ingredient number {i} and stir for {i} minutes.\n"
    for i in range(1, 16)
)
CHORUS = (
    "Verse 1:\nThe road is long, the night is cold.\n\n"
    + "Chorus:\nSing it loud, sing it clear, the morning light is almost here.\n\n" * 3
    + "Outro:\nAnd so we walk on home."
)
ZEROS = "```python\ngrid = [\n" + "    [0, 0, 0, 0, 0, 0, 0, 0],\n" * 8 + "]\n```\nAn 8x8 grid."
SHORT = "No, no, no, no, no, no."


@pytest.mark.parametrize(
    "text",
    [MARKDOWN_TABLE, NUMBERS, NUMBERED, CHORUS, ZEROS, SHORT],
    ids=["markdown_table", "numbers_1_to_50", "numbered_list", "chorus", "zero_grid", "short"],
)
def test_loop_does_not_fire_on_legitimately_repetitive_answers(smol, text) -> None:
    ids = [*smol.tokenizer.encode(text), smol.end_id]
    assert check_answer(ids, "stop", markers=Markers(smol.stop_ids), content=text) == ()
    # nor when the same answer is cut at max_tokens right after its repetitive part ends
    cut = smol.tokenizer.encode(text)
    assert "repetition_loop" not in check_answer(cut, "length")


# --- truncated, empty_answer ------------------------------------------------------------------


def test_truncated() -> None:
    assert truncated("length")
    assert not truncated("stop") and not truncated("tool_calls")
    assert check_answer([5, 6, 7], "length", content="abc") == ("truncated",)
    assert check_answer([5, 6, 7], "stop", content="abc") == ()


def test_empty_answer() -> None:
    assert empty_answer(None, 0) and empty_answer(" \n", 0)
    assert not empty_answer("42", 0)
    assert not empty_answer(None, 1)  # a tool call is an answer
    assert check_answer([5], "stop", content="") == ("empty_answer",)
    assert check_answer([5], "tool_calls", content=None, tool_calls=1) == ()


# --- think_unclosed ---------------------------------------------------------------------------


def _sample(prompt: list[int], response: list[int], finish: str) -> Sample:
    ids = prompt + response
    mask = [False] * len(prompt) + [True] * len(response)
    return Sample("s", ids, mask, len(prompt), "engine", finish, PROV)


def test_think_unclosed_with_a_real_format(bound) -> None:
    b = bound("qwen3")
    enc = b.tokenizer.encode
    m = Markers(b.stop_ids, b.ids["think_open"], b.ids["think_close"])
    o, c = b.ids["think_open"], b.ids["think_close"]

    prompt = Target(b).prompt_ids([Message("user", "What is 2+2?")])
    unclosed = [o, *enc("\nLet me add 2 and 2, that is 4."), b.end_id]
    closed = [o, *enc("\n2 and 2 is 4.\n"), c, *enc("\n\n4"), b.end_id]
    view = ApiView(content="", finish_reason="stop", reasoning="Let me add")
    assert check_sample(_sample(prompt, unclosed, "stop"), view, m) == (
        "empty_answer",
        "think_unclosed",
    )
    view = ApiView(content="4", finish_reason="stop", reasoning="2 and 2 is 4.")
    assert check_sample(_sample(prompt, closed, "stop"), view, m) == ()
    # cut inside the think block: truncated, not think_unclosed (it never finished)
    view = ApiView(content=None, finish_reason="length", reasoning="Let me add")
    assert check_sample(_sample(prompt, unclosed[:-1], "length"), view, m) == (
        "truncated",
        "empty_answer",
    )
    # the prompt opens the block (DeepSeek, Kimi): an answer with no marker at all is unclosed,
    # one that closes it is not
    opened = [*prompt, o]
    view = ApiView(content="x", finish_reason="stop", reasoning="y")
    assert check_sample(_sample(opened, [*enc("so 4"), b.end_id], "stop"), view, m) == (
        "think_unclosed",
    )
    answer = [*enc("so 4"), c, *enc("4"), b.end_id]
    assert check_sample(_sample(opened, answer, "stop"), view, m) == ()
    # a format without think markers never fires
    assert not think_unclosed(unclosed, "stop", Markers(b.stop_ids))


# --- near_duplicate_answer --------------------------------------------------------------------


def test_near_duplicate_across_prompts_only() -> None:
    a = "The Amazon, a mesmerizing expanse of nature's wonders, is home to the river."
    idx = AnswerIndex()
    assert idx.seen("p1", a) is None
    assert idx.seen("p1", a) is None  # another sample of the same prompt
    assert (
        idx.seen(
            "p2",
            "  THE amazon,  a mesmerizing expanse of nature's\nwonders, is home to the river. ",
        )
        == "p1"
    )
    assert idx.seen("p3", a + " It flows east.") is None
    assert idx.seen("p4", "Yes.") is None and idx.seen("p5", "Yes.") is None  # too short
    assert normalise("A\u00a0 B\n\tC") == "a b c"


def test_near_duplicate_memory_is_bounded() -> None:
    idx = AnswerIndex(capacity=2)
    texts = [f"answer number {i} is a long enough answer to be indexed" for i in range(3)]
    for i, t in enumerate(texts):
        assert idx.seen(f"p{i}", t) is None
    assert len(idx) == 2
    assert idx.seen("q", texts[0]) is None  # forgotten, the oldest
    assert idx.seen("q2", texts[2]) == "p2"


# --- language_mismatch ------------------------------------------------------------------------


def _detect(text: str) -> str | None:
    """A stand-in detector: kana means Japanese, ASCII letters English, else unsure."""
    if re.search(r"[\u3040-\u30ff]", text):
        return "ja"
    return "en" if re.search(r"[a-zA-Z]{4}", text) else None


def test_language_mismatch_with_a_callers_detector() -> None:
    prompt = "Create a video script for training new employees of a car wash business."
    assert language_mismatch(
        prompt,
        "メジッテアッパエデイググルクリストデャディランサラタドノパスドラペランサアッパサラス",
        _detect,
    )
    assert not language_mismatch(
        prompt, "Here is a video script for training new employees.", _detect
    )
    assert not language_mismatch("Hi", "こんにちは", _detect)  # too short to judge
    assert not language_mismatch(prompt, "1234 5678 9012 3456 7890 1234 5678 9012 3456", _detect)


def test_every_check_is_listed_once() -> None:
    names = [n for n, _ in QUALITY_CHECKS]
    assert len(set(names)) == len(names) == 7
    assert all(d and "\n" not in d for _, d in QUALITY_CHECKS)


# --- the figures on the dev ground truth (module docstring, BENCHMARKS.md) -------------------


def test_counts_on_the_dev_ground_truth(smol) -> None:
    from draftdata.sources import read_ground_truth

    records = read_ground_truth(GROUNDTRUTH, Counter())
    assert len(records) == 531
    markers = Markers(smol.stop_ids)
    idx = AnswerIndex()
    counts: Counter[str] = Counter()
    dups = []
    for g in records:
        text = g.view.content if g.view is not None else None
        decoded = smol.tokenizer.decode([i for i in g.output_ids if i not in smol.stop_ids])
        assert text == decoded  # what the README says api_view.content is
        counts.update(check_answer(g.output_ids, g.finish_reason, markers=markers, content=text))
        if idx.seen(re.sub(r"-(greedy|sample)$", "", g.id), text) is not None:
            dups.append(g.id)
    assert counts == Counter(repetition_loop=129, truncated=347)
    assert dups == ["mtbench_turn2-50-greedy", "mtbench_turn2-50-sample", "mtbench_turn2-55-greedy"]
