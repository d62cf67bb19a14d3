"""Trust nothing a server sends: every answer below is well-formed HTTP and (but for the
non-UTF-8 one) valid JSON, and absurd. Each is served by a raw asyncio server of the tests' own
(tests/hostile.py: no draftdata code), and each failed on 4925d9d: answers lost or the run
blocked for good, the budget walked through, memory past 1 GB, requests in flight forgotten."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import GROUNDTRUTH, TOKENIZERS
from draftdata.store import codec
from hostile import ANSWER, Hostile, Stream, completion, honest, tokens
from servers import peak_generate
from shared import OUR_PROMPT_IDS, run, sigint_default

GT = [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()]
QUESTIONS = list(
    dict.fromkeys(m["content"] for r in GT for m in r["messages"][:1] if m["role"] == "user")
)


def prompts(path: Path, n: int, tag: str = "") -> Path:
    """``n`` real prompts, each prefixed with its index (``[i]``) and a tag the server reads."""
    lines = [
        json.dumps(
            {
                "id": f"{tag or 'p'}{i}",
                "messages": [{"role": "user", "content": f"[{i}] {tag} {QUESTIONS[i]}"}],
            }
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def manifest(
    tmp: Path,
    url: str,
    datasets: dict[str, Path],
    *,
    backend: str = "",
    run_extra: str = "",
    max_tokens: int = 128,
    concurrency: int = 8,
    timeout_s: float = 30,
) -> Path:
    text = f"""
[run]
name = "hostile"
output = "{tmp / "run"}"
{run_extra}

[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"
model = "hostile"

[backends.api]
kind = "openai"
base_url = "{url}"
concurrency = {concurrency}
timeout_s = {timeout_s}
max_retries = 3
backoff_s = 0.05
{backend}
"""
    for name, src in datasets.items():
        text += f"""
[[datasets]]
name = "{name}"
source = "{src}"
reader = "openai"
backend = "api"
turns = "first"
sampling = {{ temperature = 0.0, max_tokens = {max_tokens} }}
"""
    p = tmp / "manifest.toml"
    p.write_text(text)
    return p


def attempts(run_dir: Path) -> int:
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    try:
        return int(db.execute("SELECT count(*) FROM attempts").fetchone()[0])
    finally:
        db.close()


# --- absurd values, 30% of 20 prompts each ------------------------------------------------------

N = 20
HIT = 0.3


def _deep(req: dict[str, Any], i: int, n: int) -> bytes:
    body = json.dumps(honest())
    return (body[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()


def _huge_int(req: dict[str, Any], i: int, n: int) -> bytes:
    body = honest()
    body["usage"]["completion_tokens"] = "HUGE"
    return json.dumps(body).replace('"HUGE"', str(10**400)).encode()


def _usage(**kw: Any) -> dict[str, Any]:
    u = {"prompt_tokens": 30, "completion_tokens": tokens(ANSWER)}
    u.update(kw)
    return completion(ANSWER, usage=u)


SHAPES = {
    "nan_cost": lambda req, i, n: _usage(cost=float("nan")),
    "deep": _deep,
    "tokens_2_64": lambda req, i, n: _usage(completion_tokens=2**64),
    "tokens_10_400": _huge_int,
    "big_ids": lambda req, i, n: completion(
        ANSWER,
        usage={"prompt_tokens": 30, "completion_tokens": tokens(ANSWER)},
        extra_choice={"token_ids": [2**31 + 7] * 4},
        extra={"prompt_token_ids": [2**40]},
    ),
    "int_content": lambda req, i, n: completion(12345),
    "dict_finish": lambda req, i, n: completion(ANSWER, finish={"type": "stop", "why": "eos"}),
    "not_utf8": lambda req, i, n: json.dumps(honest()).encode().replace(b"Paris", b"Par\xffis"),
}
#: the shapes whose answer cannot be used: stored and quarantined, never trained on
UNUSABLE = {"deep", "int_content", "dict_finish", "not_utf8"}


def _by_tag(req: dict[str, Any], i: int, n: int) -> dict[str, Any] | bytes | Stream:
    user = next(m["content"] for m in req["messages"] if m["role"] == "user")
    tag = user.split()[1]
    return SHAPES[tag](req, i, n)


def test_absurd_values_are_bounded_at_the_wire_and_block_nothing(tmp_path):
    """Each shape at 30% of 20 prompts: generate twice and export exit 0, every request the
    server served is an attempt in the ledger, and every answer is a sample or a counted
    drop. Absurd usage is not trusted (and counted); unusable answers are quarantined."""
    server = Hostile(_by_tag, hit=lambda i: i % 10 < HIT * 10)
    srcs = {tag: prompts(tmp_path / f"{tag}.jsonl", N, tag) for tag in SHAPES}
    with server.running() as url:
        m = manifest(tmp_path, url, srcs, backend='token_ids = "never"')
        for _ in range(2):
            r = run("generate", str(m), "--quiet")
            assert r.returncode == 0, r.stderr
            assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
        served = server.served.requests
        e = run("export", str(tmp_path / "run"))
        assert e.returncode == 0, e.stderr
    assert served == attempts(tmp_path / "run")
    assert server.served.by_shape["hit"] == len(SHAPES) * N * HIT
    st = json.loads(run("status", str(m), "--json").stdout)
    assert st["cost_usd"] >= 0
    for tag in SHAPES:
        d = st["datasets"][tag]
        assert d["done"] == d["total"] == N and d["failed"] == 0, (tag, d)
        assert d["samples"] + sum(d["drops"].values()) == d["done"], (tag, d)
        quarantined = sum(n for k, n in d["drops"].items() if k.startswith("quarantined:"))
        if tag in UNUSABLE:
            assert quarantined == N * HIT, (tag, d)
        else:
            assert quarantined == 0 and d["samples"] == N, (tag, d)
    notes = {tag: st["datasets"][tag].get("usage_notes", {}) for tag in SHAPES}
    for tag in ("nan_cost", "tokens_2_64", "tokens_10_400"):
        assert notes[tag] == {"invalid": N * HIT}, (tag, notes[tag])
    # the bytes that were not UTF-8 are stored as they came
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    blobs = [codec.decompress(b) for (b,) in db.execute("SELECT response FROM attempts WHERE ok=1")]
    db.close()
    assert sum(b"Par\xffis" in b for b in blobs) == N * HIT


# --- the budget against usage that lies ---------------------------------------------------------

CAP = 2.0
PRICE_IN, PRICE_OUT = 1.0, 1000.0
BUDGET_PROMPTS = 100


def _escalate(req: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    body = honest()
    if n >= 10:  # honest for 10 answers, then 30x under what it sent
        body["usage"]["completion_tokens"] = max(1, tokens(ANSWER) // 30)
    return body


LIARS = {
    "under": lambda req, i, n: _usage(completion_tokens=1),
    "negative": lambda req, i, n: _usage(
        prompt_tokens=-500_000, completion_tokens=-100_000, cost=-600_000.0
    ),
    "nan": lambda req, i, n: _usage(
        prompt_tokens=float("nan"), completion_tokens=float("nan"), cost=float("nan")
    ),
    "ignore_max_tokens": lambda req, i, n: completion(
        ANSWER * 12, usage={"prompt_tokens": 30, "completion_tokens": 1}
    ),
    "escalating": _escalate,
}


def real_spend(run_dir: Path) -> tuple[float, int]:
    """What the answers the run stored really cost: each 200 body's content in HF's count of
    SmolLM2 tokens, and its prompt as the run rendered it. Also the answer tokens counted."""
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    prompt_len = {
        tuple(k): len(codec.unpack_ids(ids) or ())
        for *k, ids in db.execute(
            f"SELECT dataset, prompt_id, sample_idx, turn, {OUR_PROMPT_IDS} FROM responses r"
        )
    }
    total, answer_tokens = 0.0, 0
    for *k, blob in db.execute(
        "SELECT dataset, prompt_id, sample_idx, turn, response FROM attempts "
        "WHERE http_status = 200"
    ):
        content = json.loads(codec.unpack_text(blob))["choices"][0]["message"]["content"]
        n = tokens(content)
        answer_tokens += n
        total += (prompt_len.get(tuple(k), 0) * PRICE_IN + n * PRICE_OUT) / 1e6
    db.close()
    return total, answer_tokens


def billed(run_dir: Path, server: Hostile) -> float:
    """What the server billed: the tokens it wrote (its own count, hung-up streams included)
    and each answered prompt as the run rendered it."""
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    prompt_tokens = sum(
        len(codec.unpack_ids(ids) or ())
        for (ids,) in db.execute(f"SELECT {OUR_PROMPT_IDS} FROM responses r")
    )
    db.close()
    return (prompt_tokens * PRICE_IN + server.served.answer_tokens * PRICE_OUT) / 1e6


@pytest.mark.parametrize("liar", sorted(LIARS))
def test_the_budget_charges_its_own_count_whatever_usage_says(tmp_path, liar):
    server = Hostile(LIARS[liar])
    src = prompts(tmp_path / "p.jsonl", BUDGET_PROMPTS)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            backend=f"price_in_per_mtok = {PRICE_IN}\nprice_out_per_mtok = {PRICE_OUT}",
            # counts that do not describe the answers stop a text dataset first (the count
            # gate, tests/test_count_witness.py): here the budget alone is tested
            run_extra=f"budget_usd = {CAP}\nmax_count_mismatch = 1",
        )
        r = run("generate", str(m), "--quiet")
        assert "Traceback" not in r.stderr, r.stderr
    _, counted = real_spend(tmp_path / "run")
    # every answer served is stored, but for what came after a hang-up (a runaway stream)
    assert counted == server.served.answer_tokens or liar == "ignore_max_tokens"
    spent = billed(tmp_path / "run", server)  # what the server wrote, stored or not
    print(f"{liar}: real spend ${spent:.3f} against a ${CAP} cap ({spent / CAP:.2f}x)")
    assert spent <= 1.1 * CAP, f"{liar}: real spend ${spent:.2f} for a ${CAP} cap"
    st = json.loads(run("status", str(m), "--json").stdout)
    assert 0 <= st["cost_usd"] <= CAP
    if liar == "ignore_max_tokens":
        assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
        assert server.served.requests == 1  # the first answer of a capped run goes alone
    else:
        assert "budget reached" in r.stderr, r.stderr
        assert st["cost_usd"] >= 0.8 * CAP  # the cap is used, not refused early
    if liar not in ("escalating", "ignore_max_tokens"):  # (hung up on before its usage came)
        assert sum(st["datasets"]["d"]["usage_notes"].values()) >= 1


# --- a server that turns to ignoring max_tokens, paid for what it wrote --------------------------

RUNAWAY_MAX = 32


def _runaway(honest_answers: int) -> Any:
    """Honest for ``honest_answers``, then 30 times what max_tokens allows (990 tokens)."""
    return lambda req, i, n: honest(ANSWER if n < honest_answers else ANSWER * 30)


@pytest.mark.parametrize(("cap", "concurrency"), [(2.0, 8), (20.0, 32)])
def test_a_server_that_turns_to_ignoring_max_tokens_is_hung_up_on(tmp_path, cap, concurrency):
    """Issue 37's defect 9: honest while the run warms up (a capped run's first requests go
    one at a time) and 10 answers more, then 30x past max_tokens, with every request in
    flight. Paid for whole (on 5108872), the server billed 3.9x a $2 cap at concurrency 8
    (0.72x of $20 at 32, with 12 whole runaways paid; no stream to hang up on). Streamed (a run with a budget
    streams), each is hung up on once past 1.5 x max_tokens + 32 tokens, and the server bills
    what it wrote until it saw the client gone (1 ms a token, a fast engine)."""
    server = Hostile(_runaway(2 * concurrency + 10), token_s=0.001)
    src = prompts(tmp_path / "p.jsonl", 4 * concurrency + 10)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            backend=f"price_in_per_mtok = {PRICE_IN}\nprice_out_per_mtok = {PRICE_OUT}",
            run_extra=f"budget_usd = {cap}",
            max_tokens=RUNAWAY_MAX,
            concurrency=concurrency,
        )
        r = run("generate", str(m), "--quiet")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    spent = billed(tmp_path / "run", server)
    print(f"cap ${cap}, concurrency {concurrency}: billed ${spent:.3f} ({spent / cap:.2f}x)")
    assert spent <= 1.1 * cap, f"billed ${spent:.2f} for a ${cap} cap"
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    stored = [
        json.loads(codec.unpack_text(b))
        for (b,) in db.execute("SELECT response FROM attempts WHERE http_status = 200")
    ]
    db.close()
    # every answer is stored; a hung-up one says so, and is never more than the limit + a token
    stopped = [b for b in stored if b.get("stream_stopped") == "runaway"]
    assert stopped, "no stream was hung up on"
    for b in stopped:
        assert tokens(b["choices"][0]["message"]["content"]) <= 1.5 * RUNAWAY_MAX + 32 + 1
    st = json.loads(run("status", str(m), "--json").stdout)
    assert st["cost_usd"] >= 0.9 * spent  # what the run charged, against what was billed


# --- a streamed answer is the whole answer ------------------------------------------------------


def _rich(req: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """Reasoning, then content or two tool calls (text and arguments with CJK, emoji, escapes)."""
    msg: dict[str, Any] = {"role": "assistant", "reasoning": f'Think {i}: 東京 → 🙂 "quoted"\n'}
    if i % 2:
        msg["content"] = None
        msg["tool_calls"] = [
            {
                "id": f"call_{i}_{k}",
                "type": "function",
                "function": {
                    "name": f"lookup_{k}",
                    "arguments": json.dumps({"q": f"東京 {k}", "n": i}),
                },
            }
            for k in range(2)
        ]
    else:
        msg["content"] = f"{ANSWER} ({i}) — déjà vu, 漢字 🙂"
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if i % 2 else "stop"}], "usage": {"prompt_tokens": 30, "completion_tokens": 40}}  # fmt: skip


def test_a_streamed_answer_reads_as_the_same_answer_sent_whole(tmp_path):
    """The same answers sent whole and streamed (reasoning and content a token an event, tool
    calls as OpenAI streams them): read back from the ledger, each streamed answer is the
    whole one, field for field."""
    from draftdata.records.wire import parse_answer

    views = {}
    for mode in ("never", "always"):
        server = Hostile(_rich)
        src = prompts(tmp_path / "p.jsonl", 6)
        with server.running() as url:
            out = tmp_path / mode
            out.mkdir()
            m = manifest(out, url, {"d": src}, backend=f'stream = "{mode}"')
            r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
        db = sqlite3.connect(out / "run" / "ledger.sqlite")
        rows = db.execute("SELECT prompt_id, response FROM attempts WHERE ok = 1").fetchall()
        db.close()
        got = {}
        for pid, blob in rows:
            a = parse_answer(codec.unpack_text(blob), want_ids=False)
            assert not isinstance(a, str) and a.problem is None, a
            got[pid] = (a.view, a.finish_reason, a.usage)
        views[mode] = got
    assert len(views["always"]) == 6 and views["always"] == views["never"]
    assert sum(bool(v.tool_calls) for v, _, _ in views["always"].values()) == 3


# --- memory ---------------------------------------------------------------------------------


#: 4.1 million characters (under a 4 MiB cap that counts characters), 12.3 MB of UTF-8
CJK = "漢字" * 2_050_000


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(
            lambda req, i, n: json.dumps(
                completion(CJK, usage={"completion_tokens": 5}), ensure_ascii=False
            ).encode(),
            id="cjk",
        ),
        pytest.param(
            lambda req, i, n: Stream(
                b'{"choices":[{"message":{"role":"assistant","content":"',
                b"a" * (1 << 20),
                400 << 20,
            ),
            id="no_length_400mb",
        ),
    ],
)
def test_a_huge_body_is_cut_while_reading_and_memory_stays_flat(tmp_path, shape):
    server = Hostile(shape)
    src = prompts(tmp_path / "p.jsonl", 3)
    with server.running() as url:
        m = manifest(tmp_path, url, {"d": src})
        r, peak_kb = peak_generate(m)
    print(f"peak RSS of generate: {peak_kb / 1024:.0f} MB")
    assert peak_kb < 300 * 1024, f"peak RSS {peak_kb / 1024:.0f} MB"
    assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    # the answers already in flight when the first came back are stored too; nothing after
    assert st["done"] == server.served.requests == attempts(tmp_path / "run") >= 1, st
    assert st["drops"] == {"quarantined:oversized": st["done"]}, st


# --- requests in flight at an interrupt -------------------------------------------------------


def stopped(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """``proc`` ends within ``timeout``; else it fails with the stack of every thread of it
    (draftdata prints them on SIGUSR1), then kills it."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        _, stderr = proc.communicate()
        raise AssertionError(
            f"still running {timeout} s after the signal:\n{stderr.decode(errors='replace')}"
        ) from None


def test_requests_in_flight_at_ctrl_c_or_kill_9_are_counted_and_asked_again(tmp_path):
    server = Hostile(lambda req, i, n: honest())
    src = prompts(tmp_path / "p.jsonl", 30)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            # no capability probe: it goes alone, and the test waits for 8 requests at once
            backend=f'token_ids = "never"\nprice_in_per_mtok = {PRICE_IN}\n'
            f"price_out_per_mtok = {PRICE_OUT}",
        )
        cmd = [sys.executable, "-m", "draftdata", "generate", str(m), "--quiet"]
        for sig in (signal.SIGINT, signal.SIGKILL, signal.SIGINT):
            server.hold.set()
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=sigint_default,
            )
            deadline = time.monotonic() + 300
            while server.served.held < 8:  # every worker has a request in the server's hands
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the run never had 8 requests in flight"
                time.sleep(0.05)
            os.kill(proc.pid, sig)
            stopped(proc, 120)
            server.hold.clear()
            while server.served.held:  # the dead run's requests are let go before the next
                time.sleep(0.02)
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
        served = server.served.requests
    assert served == attempts(tmp_path / "run")
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    assert st["done"] == st["total"] == 30
    assert st["errors"].get("interrupted") == 24, st  # 8 in flight at each of 3 interrupts
    max_cost = 128 * PRICE_OUT / 1e6
    assert st["possibly_paid_usd"] >= 24 * max_cost * 0.99, st


# --- a prompt with no user message ----------------------------------------------------------


@pytest.mark.parametrize("turns", ["first", "last", "all", "joined"])
def test_a_prompt_with_no_user_message_is_counted_and_blocks_nothing(tmp_path, turns):
    """It has no turn to answer in any mode: counted when the dataset is read. With first|last
    it blocked the run (the batched first-turn render raised outside the quarantine); with
    all|joined it vanished uncounted."""
    src = prompts(tmp_path / "p.jsonl", 4)
    lonely = {"id": "lonely", "messages": [{"role": "system", "content": "You are terse."}]}
    src.write_text(src.read_text() + json.dumps(lonely) + "\n")
    server = Hostile(lambda req, i, n: honest())
    with server.running() as url:
        m = manifest(tmp_path, url, {"d": src})
        m.write_text(m.read_text().replace('turns = "first"', f'turns = "{turns}"'))
        for _ in range(2):
            r = run("generate", str(m), "--quiet")
            assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        e = run("export", str(tmp_path / "run"))
        assert e.returncode == 0, e.stderr
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    assert st["done"] == st["total"] == 4 and st["samples"] == 4, st
    doc = json.loads((tmp_path / "run" / "export" / "manifest.json").read_text())
    assert doc["datasets"]["d"]["read_drops"] == {"no_user_message": 1}


def test_with_no_price_an_answer_past_max_tokens_is_still_counted(tmp_path):
    """With no output price an answer's tokens change nothing that is charged, so it is not
    encoded to count them (``charges.answer_tokens``), unless its UTF-8 bytes could hold more
    tokens than the runaway limit. A server that ignores max_tokens and says 1 token in its
    usage is still stopped at its first answers, by our own count."""
    server = Hostile(LIARS["ignore_max_tokens"])
    src = prompts(tmp_path / "p.jsonl", 40)
    with server.running() as url:
        m = manifest(tmp_path, url, {"d": src}, max_tokens=RUNAWAY_MAX, concurrency=2)
        r = run("generate", str(m), "--quiet")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["d"]
    assert st["drops"].get("quarantined:runaway", 0) >= 1 and st["done"] <= 2, st


def test_the_next_dataset_starts_in_the_tail_of_the_one_before(tmp_path):
    """Datasets go in order, but the next one starts once the one before has handed out its
    last conversation: its requests take the slots that tail frees (they drained to one in
    flight before, 1.0 h summed at real latency in the 10k rehearsal), and the backend's
    concurrency still bounds what is in flight."""
    spans = _two_datasets(tmp_path, 10, 10, token_s=0.004, concurrency=4)  # ~0.12 s answers
    assert len(spans) == 20
    a_last = max(end for ds, _, end in spans if ds == "a")
    b_first = min(start for ds, start, _ in spans if ds == "b")
    assert b_first < a_last, "the second dataset waited for the first one's last answer"
    most = max(sum(1 for _, s, e in spans if s <= t < e) for _, t, _ in spans)
    assert most <= 4, most


@pytest.mark.parametrize("runaway", [False, True])
def test_a_capped_run_goes_wide_at_once_where_each_stream_is_bounded(tmp_path, runaway):
    """A capped run's first answers went one at a time until one was charged (9.5 s to 16 in
    flight after the 10k rehearsal's resume, 0.13 h at real latency). Streamed, each request
    is hung up on past the runaway limit, so it can cost no more than that: the first wave
    reserves that bound and goes at full concurrency (no capability probe here:
    token_ids = "never"). A server that ignores max_tokens from its first answer is still
    billed within the cap."""
    shape = _runaway(0) if runaway else (lambda req, i, n: honest())
    server = Hostile(shape, token_s=0.002)
    src = prompts(tmp_path / "p.jsonl", 40)
    with server.running() as url:
        m = manifest(
            tmp_path,
            url,
            {"d": src},
            backend=f"price_in_per_mtok = {PRICE_IN}\nprice_out_per_mtok = {PRICE_OUT}\n"
            'token_ids = "never"',
            run_extra=f"budget_usd = {CAP}",
            max_tokens=RUNAWAY_MAX,
            concurrency=8,
        )
        r = run("generate", str(m), "--quiet")
    assert "Traceback" not in r.stderr, r.stderr
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    spans = sorted(db.execute("SELECT started_at, started_at + latency_s FROM attempts"))
    db.close()
    first_end = min(e for _, e in spans)
    at_once = sum(1 for s, _ in spans if s < first_end)
    assert at_once >= 4, f"{at_once} requests went out before the first answer came back"
    spent = billed(tmp_path / "run", server)
    print(f"runaway={runaway}: {at_once} at once; billed ${spent:.3f} of ${CAP}")
    assert spent <= 1.1 * CAP, f"billed ${spent:.2f} for a ${CAP} cap"
    if runaway:
        assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    else:
        assert r.returncode == 0, r.stderr


def test_a_dataset_of_a_few_keys_does_not_hold_the_next_back(tmp_path):
    """A dataset with fewer keys than the concurrency (a resumed one's leftovers) has handed out
    all of them once each worker holds one: the next dataset starts then, not when the first
    of those answers comes back (the 10k rehearsal's resume took 14 s to reach 16 in flight)."""
    # (no capability probe: it would hold every request back until its own answer)
    spans = _two_datasets(tmp_path, 2, 6, token_s=0.01, backend='token_ids = "never"')
    a_first_end = min(end for ds, _, end in spans if ds == "a")
    b_first = min(start for ds, start, _ in spans if ds == "b")
    assert b_first < a_first_end, "the second dataset waited for the first one's first answer"


def _two_datasets(
    tmp_path: Path, na: int, nb: int, *, token_s: float, backend: str = "", concurrency: int = 8
) -> list[tuple[str, float, float]]:
    """Datasets "a" and "b" of ``na`` and ``nb`` prompts generated against an honest server
    whose tokens take ``token_s``; each answered attempt as (dataset, start, end)."""
    server = Hostile(lambda req, i, n: honest(), token_s=token_s)
    a, b = prompts(tmp_path / "a.jsonl", na, "a"), prompts(tmp_path / "b.jsonl", nb, "b")
    with server.running() as url:
        m = manifest(tmp_path, url, {"a": a, "b": b}, backend=backend, concurrency=concurrency)
        r = run("generate", str(m), "--quiet")
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    spans = db.execute(
        "SELECT dataset, started_at, started_at + latency_s FROM attempts WHERE ok = 1"
    ).fetchall()
    db.close()
    return spans
