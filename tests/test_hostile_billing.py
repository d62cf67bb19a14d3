"""Every way a provider bills (issue 53, items 1-5), against the tests' own lying server
(tests/hostile.py: no draftdata code), each recounted from what the server itself wrote. Each
failed on 42e677c:

1. a request that timed out was never charged, though a provider bills a generation the client
   stopped waiting for (120x a $2 cap);
2. a proxy that re-chunks the stream cut the runaway stop's last event in two: the answer was
   quarantined as ``bad_stream`` and the backend never stopped (1.65-1.75x the cap);
3. reasoning streamed only as ``reasoning_details`` (OpenRouter's shape) was not counted (4.97x);
4. fields the stream's watch does not count grew memory without bound (GBs in 30 s)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from draftdata.store import codec
from hostile import ANSWER, Events, Hostile, completion, honest, tokens
from servers import peak_generate
from shared import run
from test_hostile_servers import CAP, PRICE_IN, PRICE_OUT, _runaway, billed, manifest, prompts

PRICED = f"price_in_per_mtok = {PRICE_IN}\nprice_out_per_mtok = {PRICE_OUT}"


def _stored_bodies(run_dir: Any) -> list[dict[str, Any]]:
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    try:
        return [
            json.loads(codec.unpack_text(b))
            for (b,) in db.execute("SELECT response FROM attempts WHERE http_status = 200")
        ]
    finally:
        db.close()


# --- 1. a request the client stopped waiting for is still billed ---------------------------------

SLOW_MAX = 128


@pytest.mark.parametrize(
    ("how", "answer", "stream"),
    [
        # a whole answer within max_tokens (about 120 tokens), billed as the request arrives,
        # sent after 6 s against a 1 s timeout; ``stream: true`` is ignored
        ("whole", ANSWER * 3, "auto"),
        ("whole", ANSWER * 3, "never"),
        # a stream that runs past max_tokens, too slow to reach the runaway stop before the
        # timeout: billed for what it wrote until the client hung up
        ("stream", ANSWER * 30, "auto"),
    ],
)
def test_a_request_that_times_out_is_charged_what_it_may_have_cost(tmp_path, how, answer, stream):
    server = Hostile(lambda req, i, n: honest(answer), token_s=0.05, whole_only=how == "whole")
    src = prompts(tmp_path / "p.jsonl", 40)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            backend=PRICED + f'\nstream = "{stream}"',
            run_extra=f"budget_usd = {CAP}",
            max_tokens=SLOW_MAX,
            timeout_s=1,
        )
        r = run("generate", str(m), "--quiet")
    assert "Traceback" not in r.stderr, r.stderr
    spent = billed(tmp_path / "run", server)
    print(
        f"{how}/{stream}: {server.served.requests} requests, billed ${spent:.3f} ({spent / CAP:.2f}x)"
    )
    assert spent <= 1.1 * CAP, f"billed ${spent:.2f} for a ${CAP} cap"
    assert "budget reached" in r.stderr, r.stderr
    st = json.loads(run("status", str(m), "--json").stdout)
    d = st["datasets"]["d"]
    assert d["done"] == 0 and d["unanswered"] == server.served.requests, d
    # each is charged at least what the server wrote for it
    assert spent <= st["cost_usd"] + d["possibly_paid_usd"] <= CAP + 1e-9, st
    human = run("status", str(m)).stdout
    assert "possibly paid" in human and "timed out" in human, human
    # a later run counts them too: nothing more is sent while they fill the cap
    before = server.served.requests
    with server.running() as url2:
        m2 = manifest(
            tmp_path,
            url2,
            {"d": src},
            backend=PRICED + f'\nstream = "{stream}"',
            run_extra=f"budget_usd = {CAP}",
            max_tokens=SLOW_MAX,
            timeout_s=1,
        )
        r2 = run("generate", str(m2), "--quiet")
    assert "budget reached" in r2.stderr, r2.stderr
    assert server.served.requests == before


# --- 2. a proxy that re-chunks the stream -------------------------------------------------------

RUNAWAY_MAX = 32


@pytest.mark.parametrize("rechunk", [1000, 4096])
def test_a_runaway_stream_through_a_rechunking_proxy_is_hung_up_on(tmp_path, rechunk):
    """Every answer runs 30x past max_tokens; the proxy passes the stream on in pieces of
    ``rechunk`` bytes, so the hang-up comes in the middle of an event."""
    server = Hostile(lambda req, i, n: honest(ANSWER * 30), token_s=0.001, rechunk=rechunk)
    src = prompts(tmp_path / "p.jsonl", 26)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            backend=PRICED,
            run_extra=f"budget_usd = {CAP}",
            max_tokens=RUNAWAY_MAX,
        )
        r = run("generate", str(m), "--quiet")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    spent = billed(tmp_path / "run", server)
    print(f"rechunk {rechunk}: {server.served.requests} requests, billed ${spent:.3f}")
    assert spent <= 1.1 * CAP, f"billed ${spent:.2f} for a ${CAP} cap"
    stored = _stored_bodies(tmp_path / "run")
    assert stored and all(b.get("stream_stopped") == "runaway" for b in stored), stored[:1]
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    assert st["drops"] == {"quarantined:runaway": st["done"]}, st


# --- 5. a whole-answer server that turns to ignoring max_tokens: the stated bound ------------


def test_a_whole_answer_server_that_turns_runaway_stays_within_the_stated_bound(tmp_path):
    """Answers only whole (``stream: true`` ignored): honest for 26 answers, then 30x past
    max_tokens. The first runaway answer stops the backend, but every request in flight when
    the server turns is paid whole: the README states the bound as the cap plus one whole
    runaway per request in flight (``concurrency``)."""
    concurrency = 8
    server = Hostile(_runaway(2 * concurrency + 10), token_s=0.001, whole_only=True)
    src = prompts(tmp_path / "p.jsonl", 4 * concurrency + 10)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            backend=PRICED,
            run_extra=f"budget_usd = {CAP}",
            max_tokens=RUNAWAY_MAX,
            concurrency=concurrency,
        )
        r = run("generate", str(m), "--quiet")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    spent = billed(tmp_path / "run", server)
    runaway = (40 * PRICE_IN + tokens(ANSWER * 30) * PRICE_OUT) / 1e6
    bound = CAP + concurrency * runaway
    print(
        f"whole answers: billed ${spent:.3f} ({spent / CAP:.2f}x the cap; stated bound "
        f"${bound:.2f}, {bound / CAP:.2f}x)"
    )
    assert spent <= bound, f"billed ${spent:.2f}, past the stated ${bound:.2f}"
    st = json.loads(run("status", str(m), "--json").stdout)
    assert st["cost_usd"] >= 0.9 * spent  # every whole answer paid is charged


# --- 3. reasoning streamed as reasoning_details alone --------------------------------------------


def test_reasoning_streamed_only_as_reasoning_details_is_counted(tmp_path):
    """OpenRouter's shape with no ``reasoning`` text beside it: honest for 26 answers (a
    capped run's first go one at a time), then 1,200 tokens of reasoning for max_tokens = 32
    with every request in flight, then a short answer."""

    def shape(req: dict[str, Any], i: int, n: int) -> dict[str, Any]:
        body = completion("Paris.", usage={"prompt_tokens": 30, "completion_tokens": 1})
        body["choices"][0]["message"]["reasoning"] = ANSWER * (30 if n >= 26 else 1) + "\n"
        return body

    server = Hostile(shape, token_s=0.001, details="only")
    src = prompts(tmp_path / "p.jsonl", 42)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            backend=PRICED,
            run_extra=f"budget_usd = {CAP}",
            max_tokens=RUNAWAY_MAX,
        )
        r = run("generate", str(m), "--quiet")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    spent = billed(tmp_path / "run", server)
    print(f"reasoning_details: {server.served.requests} requests, billed ${spent:.3f}")
    assert spent <= 1.1 * CAP, f"billed ${spent:.2f} for a ${CAP} cap"


def test_an_honest_answer_streaming_both_reasoning_fields_is_counted_once(tmp_path):
    """OpenRouter streams each reasoning piece twice, as ``reasoning`` and in
    ``reasoning_details``: counted once, an answer within max_tokens is not a runaway."""

    def shape(req: dict[str, Any], i: int, n: int) -> dict[str, Any]:
        body = completion("Paris.", usage={"prompt_tokens": 30, "completion_tokens": 122})
        body["choices"][0]["message"]["reasoning"] = ANSWER * 3
        return body

    server = Hostile(shape, details="both")
    src = prompts(tmp_path / "p.jsonl", 3)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            backend=PRICED + '\nstream = "always"',
            max_tokens=SLOW_MAX,  # 122 tokens: within the runaway limit once, past it twice
        )
        r = run("generate", str(m), "--quiet")
    assert r.returncode == 0, r.stderr
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    assert st["done"] == 3 and "quarantined:runaway" not in st["drops"], st


# --- 4. what the watch does not count still has a bound -----------------------------------------


def _encrypted(k: int) -> dict[str, Any]:
    entry = {"type": "reasoning.encrypted", "data": "QUJD" * 1024, "format": "x", "index": k}
    return {"choices": [{"index": 0, "delta": {"reasoning_details": [entry]}}]}


def _choice(k: int) -> dict[str, Any]:
    return {"choices": [{"index": k, "delta": {"role": "assistant"}}]}


def _call(k: int) -> dict[str, Any]:
    call = {"index": k, "id": f"c{k}", "type": "function"}  # no name: no text to count
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


@pytest.mark.parametrize(
    ("event", "total"),
    [
        pytest.param(_encrypted, 600 << 20, id="encrypted_details"),
        pytest.param(_choice, 120 << 20, id="choice_indices"),
        pytest.param(_call, 200 << 20, id="tool_call_indices"),
    ],
)
def test_a_stream_of_fields_not_counted_keeps_memory_flat(tmp_path, event, total):
    server = Hostile(lambda req, i, n: Events(event, total))
    src = prompts(tmp_path / "p.jsonl", 2)
    with server.running() as url:
        m = manifest(tmp_path, url, {"d": src}, backend=PRICED + '\nstream = "always"')
        r, peak_kb = peak_generate(m)
    print(f"peak RSS of generate: {peak_kb / 1024:.0f} MB")
    assert "Traceback" not in r.stderr, r.stderr
    assert peak_kb < 300 * 1024, f"peak RSS {peak_kb / 1024:.0f} MB"
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    assert st["drops"] == {"quarantined:oversized": st["done"]}, st
