"""The count witness (issue 55, item 1): the server's own token counts held against every
sample's ids.

The counts in each test are what the server counts, from something draftdata did not compute:
the engine's own ids in the SmolLM2 ground truth (vLLM's ``usage`` is the length of its prompt
and output ids), or the tokenizer library's own encoding of a model's raw output. A sample whose
ids equal the truth must never be flagged; an answer that lost a token on its way (a newline a
server stripped) must be, from its counts alone."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import GROUNDTRUTH
from draftdata.records import ApiView, Counting, Message, Usage
from draftdata.records.counting import warning_kind
from draftdata.records.servers import profile
from draftdata.records.wire import messages_of, view_from_record
from draftdata.tokens.counts import LABEL, fit, shape_of
from draftdata.tokens.target import Target
from hostile import ANSWER, Hostile, completion, honest, tokens
from shared import run
from test_hostile_servers import manifest, prompts


def kinds(s) -> set[str]:
    """A sample's warnings as ``status`` counts them (without one sample's own figures)."""
    return {warning_kind(w) for w in s.warnings}


def _truth_rows(n: int) -> list[dict]:
    with open(GROUNDTRUTH) as f:
        return [json.loads(line) for _, line in zip(range(n), f, strict=False)]


def _as_vllm_text(b, row: dict, content: str | None = None) -> ApiView:
    """The row's answer as a text-only vLLM response: its text, and the usage vLLM counts (its
    prompt ids and its output ids, the end of turn included)."""
    out = row["output_ids"]
    text = b.tokenizer.decode([i for i in out if i not in b.stop_ids])
    body = {
        "choices": [
            {
                "message": {"role": "assistant", "content": text if content is None else content},
                "finish_reason": row.get("finish_reason", "stop"),
            }
        ],
        "usage": {"prompt_tokens": len(row["prompt_ids"]), "completion_tokens": len(out)},
    }
    return replace(view_from_record({"response": body}), server="vllm")


def test_counts_never_flag_an_exact_sample_and_catch_most_wrong_ones(bound):
    """200 held-out SmolLM2 answers read back from text as a vLLM server returns them: every
    sample whose ids are the engine's agrees with the counts; a wrong sample whose length
    differs is flagged, with where it differs."""
    b = bound("smollm2")
    exact = flagged_exact = wrong = caught = 0
    for row in _truth_rows(200):
        s = Target(b).reconstruct(messages_of(row["messages"]), _as_vllm_text(b, row))
        truth = row["prompt_ids"] + row["output_ids"]
        if s.input_ids == truth:
            exact += 1
            flagged_exact += LABEL in s.warnings
        else:
            wrong += 1
            caught += LABEL in s.warnings
            if len(s.input_ids) != len(truth):
                assert LABEL in s.warnings, s.warnings
                detail = [w for w in s.warnings if w.startswith(LABEL + ":")]
                off = len(s.input_ids) - len(truth)
                assert detail and f"completion{off:+d}" in detail[0], (detail, off)
    assert exact >= 150 and flagged_exact == 0
    assert wrong and caught >= wrong // 2, (caught, wrong)


def test_a_stripped_newline_is_caught_by_the_counts_alone(bound):
    """A server that strips one newline from an answer's text: the text reads as whole, and
    only the completion count (the server's) shows the missing token."""
    b = bound("smollm2")
    row = next(r for r in _truth_rows(200) if "\n\n" in b.tokenizer.decode(r["output_ids"]))
    view = _as_vllm_text(b, row)
    assert view.content is not None
    stripped = _as_vllm_text(b, row, view.content.replace("\n\n", "\n", 1))
    whole = Target(b).reconstruct(messages_of(row["messages"]), view)
    assert whole.input_ids == row["prompt_ids"] + row["output_ids"]
    assert LABEL not in whole.warnings
    s = Target(b).reconstruct(messages_of(row["messages"]), stripped)
    assert s.input_ids != row["prompt_ids"] + row["output_ids"]
    assert not [w for w in s.warnings if w.startswith("lossy:")]  # nothing else says so
    assert LABEL in s.warnings and f"{LABEL}:completion-1" in kinds(s), s.warnings
    # both numbers, on the sample: its ids' count, and the server's (the model's own ids)
    both = f"(completion: ids {len(s.response_ids)}, server {len(row['output_ids'])})"
    assert f"{LABEL}:completion-1 {both}" in s.warnings, s.warnings


KIMI_RAW = "Greet, then add 2 and 2\n</think>Hello! 2 + 2 = 4.<|im_end|>"


def test_a_kimi_newline_stripped_before_think_close_is_one_short_at_the_close(bound):
    """An old SGLang stripped the newline the model wrote before ``</think>``; its profile says
    the reasoning comes back verbatim, so the text alone reads it as absent. The completion
    count (the tokenizer library's own encoding of the raw output) shows one token missing,
    right where the think block closes. (Where the newline merges into the token before it,
    ``.\n``, the count is the same and only the model's repair can tell.)"""
    b = bound("kimi-k2")
    truth = b.tokenizer.encode_as_stock(KIMI_RAW)
    user = (Message("user", "Say hello and add two and two."),)
    view = ApiView(
        "Hello! 2 + 2 = 4.",
        "stop",
        "Greet, then add 2 and 2",  # the newline before </think> stripped
        server="sglang",
        usage=Usage(completion_tokens=len(truth)),
    )
    s = Target(b, thinking=True).reconstruct(user, view)
    assert s.response_ids != truth
    assert f"{LABEL}:completion-1@think_close" in kinds(s), s.warnings
    whole = Target(b, thinking=True).reconstruct(
        user, replace(view, reasoning="Greet, then add 2 and 2\n")
    )
    assert whole.response_ids == truth and LABEL not in whole.warnings


def test_the_convention_is_read_from_the_servers_own_ids(bound):
    """A provider that counts the prefilled ``<think>`` as completion (OpenRouter's Kimi K2.5),
    and one that does not count the end marker: ``fit`` finds each from answers that carry
    both the ids and the counts, and says the declared convention does not hold."""
    b = bound("kimi-k2")
    user = (Message("user", "Say hello and add two and two."),)
    prompt = Target(b).with_options(thinking=True).prompt_ids(list(user), ())
    assert prompt[-1] == b.ids["think_open"]  # the template opens the think block
    answer = b.tokenizer.encode_as_stock(KIMI_RAW)
    shape = shape_of(b, prompt + answer, len(prompt))
    opener = Usage(len(prompt) - 1, len(answer) + 1)
    got = fit([(shape, opener)] * 5, profile("vllm").counting)
    assert got is not None and got.differs and got.agree == 5 and got.declared_agree == 0
    assert got.counting.think_opener_in_completion
    assert "think opener counted as completion" in got.line("openrouter")
    no_end = Usage(len(prompt), len(answer) - 1)
    got = fit([(shape, no_end)] * 3, Counting())
    assert got is not None and got.counting.end_marker is False
    same = fit([(shape, Usage(len(prompt), len(answer)))] * 4, Counting())
    assert same is not None and not same.differs and same.counting == Counting()
    # a server not known counts either way; its own ids narrow it to what it does
    auto = profile("auto").counting
    assert auto.end_marker is None and auto.prompt_extra is None
    told = fit([(shape, no_end)] * 3, auto)
    assert told is not None and not told.differs
    assert told.counting.end_marker is False and told.counting.prompt_extra == 0
    assert "told by its ids" in told.line("auto")


@pytest.mark.parametrize("drop", [False, True])
def test_drop_and_export_filters_name_the_label(drop):
    from draftdata.config import QUALITY_CHECK_NAMES
    from draftdata.export.filters import EXPORT_FILTERS
    from draftdata.tokens.checks import RunChecks

    assert LABEL in QUALITY_CHECK_NAMES and LABEL in EXPORT_FILTERS
    checks = RunChecks([LABEL] if drop else [])
    got = checks.dropped((LABEL, f"{LABEL}:completion-1 (completion: ids 9, server 10)"))
    assert got == (f"quality:{LABEL}" if drop else None)


# --- the gate: a text-only dataset whose counts disagree stops before more is paid ----------


def _stripping(req, i, n):
    """The model ended its answer with newlines; the server strips them from the text it
    sends, while its usage counts what the model wrote (and the end marker)."""
    written = ANSWER + "\n\n"
    return completion(ANSWER, usage={"prompt_tokens": 30, "completion_tokens": tokens(written) + 1})


SHAPES = {
    "stripping": _stripping,
    "honest": lambda req, i, n: honest(),
    "uncounted": lambda req, i, n: completion(ANSWER),  # no usage at all
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_text_dataset_whose_counts_disagree_stops_after_its_probe(tmp_path, shape):
    """A server not known (``auto``: it may or may not count the end marker) whose text lost
    the answers' last tokens: after ``count_probe`` answers the dataset stops, nothing more is
    sent, the run says why in one line and exits 1; a rerun stops again before sending. The
    same server sending the text its counts describe runs to the end with no label; one that
    sends no counts at all runs to the end too, and ``status`` says how many answers the
    counts could not check (on 904c469 nothing said so)."""
    assert tokens(ANSWER + "\n\n") > tokens(ANSWER)  # the stripped newlines were tokens
    server = Hostile(SHAPES[shape])
    src = prompts(tmp_path / "p.jsonl", 120)
    with server.running() as url:
        m = manifest(
            tmp_path, url, {"d": src}, run_extra="count_probe = 20", concurrency=4, max_tokens=64
        )
        r = run("generate", str(m))
        sent = server.served.requests
        again = run("generate", str(m))
    assert "Traceback" not in r.stderr + again.stderr, r.stderr
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    if shape != "stripping":
        assert r.returncode == 0 and sent == 120, (r.returncode, sent, r.stderr[-2000:])
        assert LABEL not in st["warnings"], st["warnings"]
        shown = run("status", str(m))
        said = shown.stderr + shown.stdout
        if shape == "uncounted":
            assert st["usage_notes"] == {"missing": 120}, st
            assert "d: 120 answers came with no token counts" in said, said
        else:
            assert "missing" not in st["usage_notes"] and "no token counts" not in said
        return
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if "d stopped:" in x]
    assert len(lines) == 1 and LABEL in lines[0] and "max_count_mismatch" in lines[0], r.stderr
    # the probe, and what was in flight when it was judged: never the whole dataset
    print(f"{sent} requests for 120 prompts; {lines[0]}")
    assert 20 <= sent <= 20 + 4 + 4, sent
    assert again.returncode == 1 and server.served.requests == sent, again.stderr[-2000:]
    assert st["warnings"][LABEL] == st["samples"] >= 20, st
    assert st["warnings"][f"{LABEL}:completion-1@end_marker"] == st["samples"], st["warnings"]


def test_a_repair_moves_the_count_its_label_holds():
    """The model's repair merges two ids into one, or splits one: the label's own count moves
    with it, and goes where the counts then agree (the run's end-to-end case is
    tests/test_model_stage.py, the replay server's counts against repaired samples)."""
    from draftdata.tokens.counts import after_repair

    two_over = (LABEL, f"{LABEL}:completion+2 (completion: ids 73, server 71)")
    assert after_repair(two_over, -2) == ()
    assert after_repair(two_over, -1) == (
        LABEL,
        f"{LABEL}:completion+1 (completion: ids 72, server 71)",
    )
    prompt_too = (LABEL, f"{LABEL}:prompt+1,completion-1@think_close (prompt: ids 9, server 8; completion: ids 70, server 71)")  # fmt: skip
    assert after_repair(prompt_too, 1) == (LABEL, f"{LABEL}:prompt+1 (prompt: ids 9, server 8)")
