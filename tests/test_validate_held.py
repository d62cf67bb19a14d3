"""Validation reports what held (issue 26, item 3).

A server that strips the reasoning's whitespace (OpenRouter style) loses text for good: the
sample is labelled ``lossy:think_whitespace`` and its ids are the format's grammar's guess. With
ground truth at hand validation knows whether the guess held, so it counts, per label, the views
that carried it and those whose ids equal the truth; the headline is ids equal over every view
(a held guess counts), beside the same over the lossless views; the gate uses the former.
"Nothing measured" is said as such (null in JSON, words in text), never as 0.0%.

The expected ids come from the tokenizer library itself (``tokenizers`` on the raw output, its
control texts matched as the model's ids are) and the prompt from the model's own chat template
rendered by transformers, never from draftdata's reconstruction."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import GROUNDTRUTH, TOKENIZERS, require
from draftdata.measure.validate import ValidationReport, validate
from draftdata.records import ApiView, GroundTruth, Message, ValidationResult
from draftdata.tokens.target import Target
from shared import run

QUESTION = "What is the weather in Paris, and what is two plus two?"
LABEL = "lossy:think_whitespace"
ZERO = re.compile(r"(?<![\d.])0\.0%")  # a rate of nothing written as 0.0% (not 100.0%)

#: (reasoning, content) as the model wrote them between its markers, no edge whitespace
ANSWERS = [
    ("The user asks two things.", "It is mild in Paris; 2 + 2 = 4."),
    ("Two and two make four.", "Four."),
    ("First the weather.\n\nThen the sum: 2 + 2 = 4.", "Paris: mild.\n\nSum: 4."),
    ("Étape 1 : la météo. Étape 2 : 2 + 2.", "À Paris il fait doux ; 2 + 2 = 4."),
    ("用户问了两个问题。", "巴黎天气温和，二加二等于四。"),
    ("Write it as code.", "```python\nprint(2 + 2)\n```"),
    ("- weather: unknown\n- sum: 4", "I cannot see live weather, but 2 + 2 = 4."),
    ("Short.", "4"),
    ("The sum is easy; the weather needs a tool I do not have.", "2 + 2 = 4. 🌤️"),
    ("Let me count: 1, 2, 3, 4.", "The answer is **4**."),
]


def gate_on(min_exact: float, rep: ValidationReport | None, gated: bool) -> Any:
    """The gate as the run decides it from a validation report (imported here so each test
    fails on its own assertion where the function is missing)."""
    from draftdata.measure.gate import gate_on as decide_on

    return decide_on(min_exact, rep, gated=gated)


def _raw(reasoning: str, content: str, before_close: str = "\n") -> str:
    """The model's output; the grammar (Qwen3) is ``<think>\\n R \\n</think>\\n\\n C``."""
    return f"<think>\n{reasoning}{before_close}</think>\n\n{content}<|im_end|>"


@pytest.fixture(scope="module")
def hf():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZERS / "qwen3" / "tokenizer.json"))


@pytest.fixture(scope="module")
def prompt_ids(hf) -> tuple[int, ...]:
    """The prompt as the model's own template renders it (transformers), encoded by the library."""
    require("transformers")  # the oracle extra: missing fails, not skips
    from oracle import render

    cfg = json.loads((TOKENIZERS / "qwen3" / "tokenizer_config.json").read_text())
    text = render(cfg["chat_template"], [{"role": "user", "content": QUESTION}])
    return tuple(hf.encode(text, add_special_tokens=False).ids)


def _records(hf, prompt_ids, before: list[str]) -> list[GroundTruth]:
    """One record per answer: the model wrote ``before[i]`` before ``</think>``; the view is
    what a stripping server returns, the same whatever the model wrote there."""
    return [
        GroundTruth(
            id=f"qwen3-{i}",
            messages=(Message("user", QUESTION),),
            prompt_ids=prompt_ids,
            output_ids=tuple(hf.encode(_raw(r, c, b), add_special_tokens=False).ids),
            finish_reason="stop",
            source="stripped",
            view=ApiView(c, "stop", r, server="openrouter"),
        )
        for i, ((r, c), b) in enumerate(zip(ANSWERS, before, strict=True))
    ]


#: the model wrote the grammar's newline, none, or two: the view is the same in every case
HELD = ["\n"] * len(ANSWERS)
MIXED = ["\n", "", "\n", "\n\n", "\n", "", "\n", "\n\n", "\n", "\n"]


def test_a_held_guess_is_counted_per_label_and_as_equal(bound, hf, prompt_ids):
    n = len(ANSWERS)
    rep = validate(Target(bound("qwen3")), _records(hf, prompt_ids, HELD))
    doc = rep.to_json()
    assert doc["warnings"] == {LABEL: n}  # every view carried the label: the path is exercised
    assert doc["lossy_labels"] == {LABEL: {"views": n, "held": n}}
    assert doc["n"] == doc["exact"] == n
    assert doc["exact_match_rate"] == 1.0
    assert doc["lossy"] == n and doc["lossless"] == 0
    assert doc["lossless_exact_match_rate"] is None  # no lossless view: nothing measured
    assert doc["categories"] == {} and doc["examples"] == {}
    gate = gate_on(1.0, rep, gated=True)
    assert gate.passed and gate.exact_match_rate == 1.0
    assert gate.verdict().startswith("gate passed: exact-match 100.0%")


def test_a_guess_that_did_not_hold_keeps_its_divergence_and_fails_the_gate(bound, hf, prompt_ids):
    records = _records(hf, prompt_ids, MIXED)
    held = MIXED.count("\n")
    results: list[ValidationResult] = []
    rep = validate(Target(bound("qwen3")), records, on_result=results.append)
    doc = rep.to_json()
    assert doc["lossy_labels"] == {LABEL: {"views": len(MIXED), "held": held}}
    assert doc["exact"] == held and doc["exact_match_rate"] == round(held / len(MIXED), 6)
    # where the guess did not hold, the result says where and why, as for any mismatch
    for gt, before, r in zip(records, MIXED, results, strict=True):
        assert r.lossy == (LABEL,)
        if before == "\n":
            assert r.exact and r.category is None
            continue
        guess = hf.encode(_raw(*ANSWERS[int(gt.id.split("-")[1])]), add_special_tokens=False).ids
        first = next(
            i for i, (a, b) in enumerate(zip(gt.output_ids, guess, strict=False)) if a != b
        )
        assert not r.exact and r.first_divergence == first
        assert r.category is not None and not r.category.startswith("lossy:")
        assert r.example is not None and r.example.position == first
    assert sum(doc["categories"].values()) == len(MIXED) - held
    share = held / len(MIXED)
    assert not gate_on(share + 0.01, rep, gated=True).passed
    assert gate_on(share - 0.01, rep, gated=True).passed


def test_nothing_measured_is_null_and_said_in_words():
    doc = ValidationReport().to_json()
    for key in ("exact_match_rate", "lossless_exact_match_rate", "token_accuracy"):
        assert doc[key] is None, key
    gate = gate_on(0.9, ValidationReport(), gated=True)
    assert not gate.passed and gate.exact_match_rate is None
    assert "nothing measured" in gate.verdict() and "%" not in gate.verdict()
    assert "no view" in gate.verdict()  # ground truth was there, but gave no view
    assert "no ground truth" in gate_on(0.9, None, gated=True).verdict()


def _all_lossy_doc(bound, hf, prompt_ids) -> dict[str, Any]:
    doc = validate(Target(bound("qwen3")), _records(hf, prompt_ids, HELD)).to_json()
    return {**doc, "format": "qwen3", "format_version": "1"}


def test_the_printed_summary_says_what_held(bound, hf, prompt_ids):
    from draftdata.cli.app import out
    from draftdata.cli.show import print_validation

    with out.capture() as cap:
        print_validation(_all_lossy_doc(bound, hf, prompt_ids))
    text = " ".join(cap.get().split())
    n = len(ANSWERS)
    assert f"think_whitespace held {n} of {n}" in text
    assert "no lossless views to measure" in text
    assert not ZERO.search(text)


def test_the_report_page_shows_the_labels_and_nothing_measured(bound, hf, prompt_ids):
    from draftdata.report.data import ReportData
    from draftdata.report.page import ExactnessSections

    doc = _all_lossy_doc(bound, hf, prompt_ids)
    n = len(ANSWERS)
    gate = gate_on(0.9, None, gated=True).to_json()
    data = ReportData(Path("run"), {"datasets": {}, "validation": doc, "gate": gate}, [], {},
                      None, None, [])  # fmt: skip
    page = ExactnessSections(data).exactness()
    assert LABEL in page
    cells = re.sub(r"<td[^>]*>", "<td>", page)
    assert f"<td>{LABEL}</td><td>{n}</td><td>{n}</td><td>100.0%</td>" in cells
    assert "no lossless views to measure" in page
    assert not ZERO.search(page)


def test_validate_cli_passes_a_held_guess_and_fails_one_that_did_not(tmp_path, hf, prompt_ids):
    for name, before, code in (("held", HELD, 0), ("mixed", MIXED, 1)):
        src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.json"
        src.write_text(
            "".join(
                json.dumps(
                    {
                        "id": gt.id,
                        "messages": [{"role": "user", "content": QUESTION}],
                        "prompt_ids": list(gt.prompt_ids or ()),
                        "output_ids": list(gt.output_ids),
                        "finish_reason": "stop",
                        "api_view": {
                            "content": gt.view.content,
                            "reasoning_content": gt.view.reasoning,
                            "finish_reason": "stop",
                        },
                    }
                )
                + "\n"
                for gt in _records(hf, prompt_ids, before)
                if gt.view is not None
            )
        )
        r = run(
            "validate",
            str(src),
            *("-t", str(TOKENIZERS / "qwen3"), "-f", "qwen3", "--server", "openrouter"),
            *("--json", str(out), "--min-exact", "0.9"),
        )
        assert r.returncode == code, r.stdout + r.stderr
        doc = json.loads(out.read_text())
        assert doc["lossy_labels"][LABEL]["held"] == before.count("\n")
        assert "no lossless views to measure" in " ".join(r.stdout.split())
        assert ("GATE FAILED" in r.stderr) == bool(code)


def test_smollm2_dev_figures_unchanged(tmp_path):
    out = tmp_path / "v.json"
    r = run(
        "validate",
        str(GROUNDTRUTH),
        *("-t", str(TOKENIZERS / "smollm2"), "-f", "chatml", "--json", str(out)),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    # the 6 answers whose text holds U+FFFD for bytes the model wrote are labelled lossy, and
    # none held (tests/test_lossy_text.py); the rate over all is unchanged
    lost = {"lossy:replacement_char": {"views": 6, "held": 0}}
    assert (doc["n"], doc["exact"], doc["lossy"], doc["lossy_labels"]) == (531, 465, 6, lost)
    assert doc["exact_match_rate"] == round(465 / 531, 6)
    assert doc["lossless_exact_match_rate"] == round(465 / 525, 6)
