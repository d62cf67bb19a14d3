"""`draftdata learn / validate / reconstruct` as a user runs them."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from conftest import GROUNDTRUTH, TOKENIZERS
from shared import run

SMOL = ["--tokenizer", str(TOKENIZERS / "smollm2"), "--format", "chatml"]


@pytest.mark.parametrize(("learn_part", "test_part"), [("0.5:1", "0:0.5"), ("0:0.5", "0.5:1")])
def test_preferences_learned_on_one_part_lift_the_other(tmp_path, learn_part, test_part):
    prefs = tmp_path / "prefs.json"
    r = run("learn", str(GROUNDTRUTH), *SMOL, "--bucket", learn_part, "-o", str(prefs))
    assert r.returncode == 0, r.stderr
    doc = json.loads(prefs.read_text())
    assert doc["rules"][0]["canonical"] == [198, 198] and doc["rules"][0]["model"] == [1116]
    assert doc["rules"][0]["after"] == "d"  # "\n\n" before a digit: one token
    plain, learned = tmp_path / "plain.json", tmp_path / "learned.json"
    run("validate", str(GROUNDTRUTH), *SMOL, "--bucket", test_part, "--json", str(plain))
    r = run(
        "validate",
        str(GROUNDTRUTH),
        *SMOL,
        "--bucket",
        test_part,
        "--prefs",
        str(prefs),
        "--json",
        str(learned),
        "--min-exact",
        "0.93",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    p, q = json.loads(plain.read_text()), json.loads(learned.read_text())
    assert p["n"] == q["n"] > 250
    assert q["exact_match_rate"] >= 0.93 > p["exact_match_rate"]
    assert q["token_accuracy"] >= 0.998
    assert "whitespace_split" not in q["categories"]  # the newline pairs are all recovered
    assert set(q["categories"]) <= {"bpe_split", "invalid_utf8"}


def test_validate_gate_and_json_schema(tmp_path):
    out = tmp_path / "v.json"
    r = run("validate", str(GROUNDTRUTH), *SMOL, "--json", str(out), "--min-exact", "0.95")
    assert r.returncode == 1
    assert "GATE FAILED" in r.stderr
    doc = json.loads(out.read_text())
    for key in ("exact_match_rate", "token_accuracy", "n", "by_source", "categories"):
        assert key in doc
    assert doc["n"] == 531 and set(doc["by_source"]) == {
        "mtbench",
        "mtbench_turn2",
        "humaneval",
        "bfcl",
        "sharegpt",
        "writingbench",
    }
    assert all(len(v) <= 5 for v in doc["examples"].values())
    assert "truth:" in r.stdout and "ours:" in r.stdout


def test_validate_mispinned_format_exits_below_gate(tmp_path):
    fmt = tmp_path / "seed.toml"
    fmt.write_text(
        'name = "seed"\nversion = "0"\nbase = "chatml"\n'
        '[markers]\nim_end = { text = "<|im_end|>", id = 3 }\n'
    )
    out = tmp_path / "v.json"
    r = run(
        "validate",
        str(GROUNDTRUTH),
        "-t",
        str(TOKENIZERS / "smollm2"),
        "-f",
        str(fmt),
        "--json",
        str(out),
        "--min-exact",
        "0.5",
    )
    assert r.returncode == 1
    doc = json.loads(out.read_text())
    assert doc["exact_match_rate"] == 0.0 and doc["categories"] == {"end_of_turn": 531}
    assert "pinned id 3 decodes to '<repo_name>'" in r.stderr


def test_reconstruct_writes_jsonl_and_parquet_and_counts_bad_lines(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = GROUNDTRUTH.read_text().splitlines()[:20]
    rec = json.loads(lines[0])
    raw = {
        "id": "raw",
        "messages": rec["messages"],
        "response": {
            "choices": [
                {
                    "message": {"role": "assistant", "content": rec["api_view"]["content"]},
                    "finish_reason": rec["finish_reason"],
                }
            ]
        },
    }
    src.write_text(
        "\n".join([*lines, "{not json", json.dumps({"id": "x", "messages": []}), json.dumps(raw)])
        + "\n"
    )
    for suffix in ("jsonl", "parquet"):
        out = tmp_path / f"out.{suffix}"
        r = run("reconstruct", str(src), *SMOL, "-o", str(out))
        assert r.returncode == 0, r.stderr
        assert "wrote 21 samples" in r.stdout
        assert "malformed_json: 1" in r.stderr and "no_response: 1" in r.stderr
        rows = (
            pq.read_table(out).to_pylist()
            if suffix == "parquet"
            else [json.loads(x) for x in out.read_text().splitlines()]
        )
        assert len(rows) == 21
        first = rows[0]
        assert (
            first["input_ids"] == rec["prompt_ids"] + rec["output_ids"] or first["id"] != rec["id"]
        )
        assert len(first["loss_mask"]) == len(first["input_ids"])
        assert first["provenance"]["format_name"] == "chatml"
        assert rows[-1]["input_ids"] == rows[0]["input_ids"]


def test_learn_refuses_prefs_for_another_tokenizer(tmp_path):
    prefs = tmp_path / "p.json"
    run("learn", str(GROUNDTRUTH), *SMOL, "-o", str(prefs))
    r = run(
        "validate",
        str(GROUNDTRUTH),
        "-t",
        str(TOKENIZERS / "qwen3"),
        "-f",
        "qwen3",
        "--prefs",
        str(prefs),
    )
    assert r.returncode == 2 and "learned for tokenizer sha256" in r.stderr
    assert "Traceback" not in r.stderr


def test_reconstruct_over_two_processes_writes_what_one_writes(tmp_path):
    """--jobs 2 on an input of two chunks, with bad lines in both: the same rows in the same
    order as one process, the same counts of drops and skipped lines; and a tokenizer that does
    not load is one line from the workers too."""
    lines = GROUNDTRUTH.read_text().splitlines()
    bad = ["{not json", json.dumps({"id": "x", "messages": []}), "[1, 2]"]
    recs = []
    for c in range(3):  # 3 x 531 records: the workers take 512 lines at a time
        recs += [json.dumps({**json.loads(x), "id": f"{c}-{i}"}) for i, x in enumerate(lines)]
        recs.insert(len(recs) - 100, bad[c % 3])
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(recs) + "\n")
    got = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"out-{jobs}.parquet"
        r = run("reconstruct", str(src), *SMOL, "-o", str(out), "--jobs", jobs)
        assert r.returncode == 0, r.stderr
        got[jobs] = (pq.read_table(out), r.stdout, r.stderr)
    assert got["1"][0].num_rows == 3 * len(lines)
    assert got["1"][0].equals(got["2"][0])
    assert got["1"][1].replace("out-1", "out-2") == got["2"][1] and got["1"][2] == got["2"][2]
    assert "malformed_json: 1" in got["2"][2] and "not_an_object: 1" in got["2"][2]
    assert "no_response: 1" in got["2"][2]
    r = run(
        "reconstruct",
        str(src),
        "-t",
        str(tmp_path / "none"),
        "-f",
        "chatml",
        "-o",
        str(tmp_path / "x.parquet"),
        "--jobs",
        "2",
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
