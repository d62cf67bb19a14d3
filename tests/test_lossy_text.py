"""Text the vocabulary cannot hold, and an input with nothing usable (issue 55, items 3 and 4).
Each failed on 31fb7a8:

- a lone surrogate in an answer (JSON's ``"\\ud83d"`` with no partner: a server that cut an
  emoji in two) became U+FFFD in the trained ids, with no label: the sample said nothing of it;
- ``reconstruct`` on an input with no usable line wrote 0 samples and exited 0 (and replaced a
  good output file with an empty one)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from conftest import GROUNDTRUTH, TOKENIZERS
from shared import one_line_exit_2, run

SMOL = ["--tokenizer", str(TOKENIZERS / "smollm2"), "--format", "chatml"]


def _record(content: str, rid: str = "r") -> dict:
    rec = json.loads(GROUNDTRUTH.read_text().splitlines()[0])
    rec["id"] = rid
    rec["api_view"] = {"content": content, "finish_reason": "stop"}
    return rec


@pytest.mark.parametrize("lone", ["\ud83d", "\ude00", "\udcff"])
def test_a_lone_surrogate_is_labelled_lossy_never_replaced_in_silence(tmp_path, lone):
    text = f"Here is a face {lone} and the rest of the answer."
    src = tmp_path / "in.jsonl"
    # as a server sends it: JSON escapes (json.dumps writes the lone surrogate as \\udXXX)
    src.write_text(json.dumps(_record(text)) + "\n" + json.dumps(_record("Plain.", "ok")) + "\n")
    out = tmp_path / "out.jsonl"
    r = run("reconstruct", str(src), *SMOL, "-o", str(out))
    assert r.returncode == 0, r.stderr
    rows = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert any(w.startswith("lossy:") for w in rows["r"]["warnings"]), rows["r"]["warnings"]
    assert not any(w.startswith("lossy:") for w in rows["ok"]["warnings"])
    assert "lossy views" in r.stderr, r.stderr
    # what the ids hold there is not the text: HF's own tokenizer cannot even take it as given
    hf = Tokenizer.from_file(str(TOKENIZERS / "smollm2" / "tokenizer.json"))
    with pytest.raises(TypeError):  # the Rust side refuses a str it cannot encode as UTF-8
        hf.encode(text, add_special_tokens=False)


def test_bytes_the_text_no_longer_holds_are_labelled_lossy(tmp_path):
    """SmolLM2 sometimes writes a byte piece that is no valid UTF-8 on its own: the server's
    text holds U+FFFD there, and which bytes they were is gone. Every such answer of the dev
    ground truth carries ``lossy:replacement_char`` (which answers: HF's own decode of the
    model's ids), and no other does. On 904c469 none was labelled."""
    hf = Tokenizer.from_file(str(TOKENIZERS / "smollm2" / "tokenizer.json"))
    lost = 0
    for line in GROUNDTRUTH.read_text().splitlines():
        rec = json.loads(line)
        lost += "\ufffd" in hf.decode(rec["output_ids"], skip_special_tokens=True)
    assert lost >= 3  # the file has such answers: the test can fail
    out = tmp_path / "v.json"
    r = run("validate", str(GROUNDTRUTH), *SMOL, "--json", str(out))
    assert r.returncode == 0, r.stderr
    v = json.loads(out.read_text())
    assert v["n"] > 500 and v["lossy"] == lost, (v["lossy"], lost)
    assert set(v["lossy_labels"]) == {"lossy:replacement_char"}, v["lossy_labels"]
    # none of them is exact: the model never wrote the U+FFFD token, and the text cannot say
    # which bytes it wrote; the labelled share is what text alone cannot reach
    assert v["lossy_held"] == 0 and v["exact"] <= v["n"] - lost


@pytest.mark.parametrize(
    "lines",
    [
        ['{"foo": 1}', "not json", json.dumps({"id": "x", "messages": "not a list"})],
        [],
    ],
    ids=["no-usable-line", "empty"],
)
def test_an_input_with_no_usable_line_exits_non_zero_and_keeps_the_old_output(tmp_path, lines):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(x + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    out.write_text('{"kept": true}\n')  # a good output of an earlier run
    line = one_line_exit_2(run("reconstruct", str(src), *SMOL, "-o", str(out)))
    assert str(src) in line and "no usable" in line, line
    assert out.read_text() == '{"kept": true}\n'
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.jsonl")]


# --- issue 55, item 2: an engine's ids against its own text ---------------------------------------


def _raw(rid: str, content: str, ids: list[int]) -> dict:
    rec = json.loads(GROUNDTRUTH.read_text().splitlines()[0])
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": ids,
    }
    return {"id": rid, "messages": rec["messages"], "response": {"choices": [choice]}}


def test_engine_ids_that_contradict_their_own_text_are_never_exported_as_engine(tmp_path):
    hf = Tokenizer.from_file(str(TOKENIZERS / "smollm2" / "tokenizer.json"))
    end = hf.token_to_id("<|im_end|>")
    text = " ".join(["The river that runs through Paris is the Seine."] * 40)
    src = tmp_path / "in.jsonl"
    src.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                # the ids of "Hi." beside 400 words of text (or of another text)
                _raw("hi", text, [*hf.encode("Hi.", add_special_tokens=False).ids, end]),
                _raw("other", text, [*hf.encode("Another answer.").ids, end]),
                # the ids of the text itself, as HF's tokenizer encodes it
                _raw("honest", text, [*hf.encode(text, add_special_tokens=False).ids, end]),
            )
        )
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    r = run("reconstruct", str(src), *SMOL, "-o", str(out))
    assert r.returncode == 0, r.stderr
    rows = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"honest"} and rows["honest"]["token_source"] == "engine", rows.keys()
    assert "ids_contradict_text: 2" in r.stderr, r.stderr


def test_the_budget_charges_the_text_where_the_ids_say_less(tmp_path):
    """A priced server whose ``token_ids`` are those of "Hi." beside 400 words: charged for the
    text (its tokens by HF's own count), and no sample exported from those ids."""
    from hostile import Hostile, completion, tokens
    from test_hostile_servers import manifest, prompts

    hf = Tokenizer.from_file(str(TOKENIZERS / "smollm2" / "tokenizer.json"))
    hi = [*hf.encode("Hi.", add_special_tokens=False).ids, hf.token_to_id("<|im_end|>")]
    text = " ".join(["The river that runs through Paris is the Seine."] * 40)
    shape = lambda req, i, n: completion(  # noqa: E731
        text,
        usage={"prompt_tokens": 30, "completion_tokens": len(hi)},
        extra_choice={"token_ids": hi, "stop_reason": None},
    )
    server = Hostile(shape)
    n = 6
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": prompts(tmp_path / "p.jsonl", n)},
            backend='price_in_per_mtok = 1.0\nprice_out_per_mtok = 1000.0\ntoken_ids = "always"',
            max_tokens=1024,
        )
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    text_usd = n * tokens(text) * 1000.0 / 1e6
    assert st["cost_usd"] >= 0.95 * text_usd, (st["cost_usd"], text_usd)
    assert st["samples"] == 0 and st["drops"].get("ids_contradict_text") == n, st
