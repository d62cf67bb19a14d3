"""Generation against the project's replay server on loopback: end to end, crash safety under
SIGKILL, and the fault matrix."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import GROUNDTRUTH, PROMPTS
from draftdata.store import codec
from servers import manifest, replay_server, stats
from shared import run

GT = [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()]


def greedy_subset(tmp_path, n, sources=("mtbench", "mtbench_turn2", "bfcl", "sharegpt")):
    """A dataset file of ground-truth conversations (first user turn only for the replay)."""
    recs = [r for r in GT if r["id"].endswith("-greedy") and r["source"] in sources][:n]
    p = tmp_path / "prompts.jsonl"
    p.write_text(
        "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in recs)
    )
    return p, recs


def status_json(m):
    r = run("status", str(m), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_generate_end_to_end_and_status(tmp_path):
    src, recs = greedy_subset(tmp_path, 30, sources=("mtbench", "bfcl"))
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=30, turns="first")
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
        st = status_json(m)
    d = st["datasets"]["gt"]
    assert (d["total"], d["done"], d["failed"], d["pending"], d["duplicates"]) == (30, 30, 0, 0, 0)
    assert d["samples"] == 30 and d["errors"] == {}
    # the samples equal the engine's own ids wherever plain reconstruction is exact
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    got = {
        pid: list(codec.unpack_ids(ids))
        for pid, ids in db.execute(
            "SELECT p.metadata_json, s.input_ids FROM samples s JOIN prompts p USING "
            "(dataset, prompt_id)"
        )
    }
    exact = sum(got[json.dumps({"id": r["id"]})] == r["prompt_ids"] + r["output_ids"] for r in recs)
    assert exact >= 25  # reconstruction, not the engine: canonical splits differ sometimes


def test_on_policy_multi_turn(tmp_path):
    """MT-Bench turn 2 asked with the model's own turn-1 answer (the replay server only knows
    turn-2 conversations that contain that exact answer)."""
    rows = [
        json.loads(line) for line in (PROMPTS / "mt_bench_question.jsonl").read_text().splitlines()
    ][:12]
    src = tmp_path / "mt.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=12, reader="mtbench", turns="all")
        r = run("generate", str(m), "--quiet")
        st = status_json(m)
        # resumed mid-conversation: second turns forgotten, asked again from the stored first
        # answers (the server answers only a history holding the model's exact first answer)
        db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
        with db:
            db.execute("DELETE FROM responses WHERE turn=1")
            db.execute("UPDATE work SET state='pending' WHERE turn=1")
        db.close()
        again = run("generate", str(m), "--quiet")
        assert status_json(m)["datasets"]["gt"]["done"] == st["datasets"]["gt"]["done"], (
            again.stderr
        )
    d = st["datasets"]["gt"]
    assert d["total"] == 24  # two turns per question
    # every question whose turn-2 record exists in the ground truth got both turns answered
    have_t2 = {
        r["messages"][0]["content"]
        for r in GT
        if r["source"] == "mtbench_turn2" and r["id"].endswith("-greedy")
    }
    expected = sum(
        2 if q["turns"][0] in have_t2 else 1
        for q in rows
        if any(g["messages"] == [{"role": "user", "content": q["turns"][0]}] for g in GT)
    )
    assert d["done"] == expected, r.stderr
    assert d["errors"].get("http_404", 0) == d["failed"]
    # our prompt ids, against the engine's own: a first turn's are kept once, with its prompt
    # (rendered as the prompts were stored); a second turn's, which hold the first answer,
    # with the answer
    from draftdata.store.ledger import Ledger

    engine = {json.dumps(g["messages"]): g["prompt_ids"] for g in GT}
    led = Ledger.read(tmp_path / "run" / "ledger.sqlite")
    try:
        answers = led.answers.of("gt")
        chains = {c.prompt.id: c for c in led.answers.chains("gt")}
    finally:
        led.close()
    assert {k.turn for k in answers} == {0, 1}
    for k, a in answers.items():
        chain = chains[k.prompt_id]
        asked = [{"role": "user", "content": chain.prompt.messages[0].content}]
        if k.turn == 1:
            first = chain.responses[0].response["choices"][0]["message"]["content"]
            asked += [{"role": "assistant", "content": first}]
            asked += [{"role": "user", "content": chain.prompt.messages[-1].content}]
        assert list(a.our_prompt_ids or ()) == engine[json.dumps(asked)], k
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    stored = dict(db.execute("SELECT turn, count(our_prompt_ids) FROM responses GROUP BY turn"))
    db.close()
    assert stored == {0: 0, 1: sum(k.turn == 1 for k in answers)}


def done_count(ledger):
    """Stored responses so far, read while the run writes (WAL allows a concurrent reader)."""
    if not ledger.exists():
        return 0
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=5)
    try:
        return db.execute("SELECT count(*) FROM responses").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def test_sigkill_five_times_then_resume_loses_nothing(tmp_path):
    src, recs = greedy_subset(tmp_path, 150)
    rng = random.Random(11)
    total = 150 * 8
    # kill at five random points of the run, whatever the machine's speed: at a random share
    # of the work, plus a random few milliseconds (mid-request, mid-transaction)
    marks = sorted(rng.uniform(0.05, 0.9) for _ in range(5))
    ledger = tmp_path / "run" / "ledger.sqlite"
    with replay_server(GROUNDTRUTH, "--faults", "429=0.3", "--seed", "3") as url:
        m = manifest(tmp_path, url, src, limit=150, turns="last", samples=8)
        progress = []
        for mark in marks:
            proc = subprocess.Popen(
                [sys.executable, "-m", "draftdata", "generate", str(m), "-q"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.time() + 120
            while done_count(ledger) < mark * total and proc.poll() is None:
                assert time.time() < deadline, "generation made no progress"
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.05))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            progress.append(done_count(ledger))
        mid = status_json(m)["datasets"]["gt"]
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
        st = status_json(m)["datasets"]["gt"]
    assert 0 < mid["done"] < total  # the kills really interrupted the run
    assert progress == sorted(progress) and len(set(progress)) == 5  # each run resumed and added
    assert (st["total"], st["done"], st["pending"], st["failed"]) == (total, total, 0, 0)
    assert st["duplicates"] == 0
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    rows = db.execute(
        "SELECT prompt_id, sample_idx, turn, count(*) FROM responses GROUP BY "
        "prompt_id, sample_idx, turn"
    ).fetchall()
    assert len(rows) == total and all(n == 1 for *_, n in rows)
    ok = db.execute("SELECT count(*) FROM attempts WHERE ok=1").fetchone()[0]
    assert ok == total  # one paid answer per key: nothing asked twice after it was stored
    # each answer points at its own attempt (ids given by the group's write, among failed and
    # interrupted attempts written one by one)
    (own,) = db.execute(
        "SELECT count(*) FROM responses r JOIN attempts a ON a.id = r.attempt_id AND a.ok = 1 "
        "AND a.dataset = r.dataset AND a.prompt_id = r.prompt_id AND "
        "a.sample_idx = r.sample_idx AND a.turn = r.turn"
    ).fetchone()
    assert own == total
    # every stored answer is the server's answer for that prompt, verbatim
    by_id = {r["id"]: r["api_view"]["content"] for r in recs}
    for meta, resp in db.execute(
        "SELECT p.metadata_json, a.response FROM responses r JOIN attempts a ON a.id = "
        "r.attempt_id JOIN prompts p USING (dataset, prompt_id)"
    ):
        body = json.loads(codec.unpack_text(resp))
        assert body["choices"][0]["message"]["content"] == by_id[json.loads(meta)["id"]]


def test_fault_matrix_every_fault_retried_or_recorded(tmp_path):
    src, _ = greedy_subset(tmp_path, 120)
    faults = (
        "429=0.1,500=0.1,slow=0.04,truncated=0.05,empty=0.04,length=0.04,reasoning=0.04,tools=0.04"
    )
    with replay_server(
        GROUNDTRUTH, "--faults", faults, "--seed", "7", "--slow-seconds", "3"
    ) as url:
        m = (
            manifest(tmp_path, url, src, limit=120, turns="last")
            .read_text()
            .replace("timeout_s = 10", "timeout_s = 1")
        )
        (tmp_path / "manifest.toml").write_text(m)
        mp = tmp_path / "manifest.toml"
        r = run("generate", str(mp), "--quiet")
        assert r.returncode == 0, r.stderr
        st = status_json(mp)["datasets"]["gt"]
        served = stats(url)
    assert st["done"] + st["failed"] + st["pending"] == st["total"] == 120
    assert st["pending"] == 0 and st["duplicates"] == 0
    # transient faults were retried: each shows up as an error attempt with its reason
    f = served["faults"]
    assert st["errors"].get("http_429", 0) == f.get("429", 0) > 0
    assert st["errors"].get("http_500", 0) == f.get("500", 0) > 0
    assert st["errors"].get("http_200_invalid_json", 0) == f.get("truncated", 0) > 0
    assert st["errors"].get("timeout", 0) == f.get("slow", 0) > 0
    assert st["attempts"] == served["requests"]
    # answers that arrived but cannot become samples under this format are dropped with a reason
    assert st["samples"] + sum(st["drops"].values()) == st["done"]
    assert st["drops"].get("reasoning_without_think_grammar", 0) == f.get("reasoning", 0)
    assert st["drops"].get("tool_calls_without_grammar", 0) == f.get("tools", 0)
    # an empty answer is asked again (up to empty_retries), then kept and dropped as empty
    assert st["errors"].get("empty_response", 0) + st["drops"].get("empty_response", 0) == f.get(
        "empty", 0
    )


def test_budget_stops_scheduling_before_it_could_be_passed(tmp_path):
    src, _ = greedy_subset(tmp_path, 40, sources=("mtbench",))
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(
            tmp_path,
            url,
            src,
            limit=40,
            turns="first",
            budget="budget_usd = 0.05",
            extra_backend="price_in_per_mtok = 20.0\nprice_out_per_mtok = 40.0",
        )
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
        assert "budget reached" in r.stderr
        st = status_json(m)
    d = st["datasets"]["gt"]
    # each request may cost up to (prompt + 256) tokens at these prices; the spend never passes
    # the budget, and most of the 40 prompts are left pending for a later, bigger budget
    assert st["cost_usd"] <= 0.05
    assert 0 < d["done"] < 40 and d["pending"] == 40 - d["done"]


def test_rate_limiter_spaces_requests(monkeypatch):
    import asyncio

    from draftdata.generate.backends import aio

    clock = {"t": 0.0}
    slept = []

    async def fake_sleep(s):
        slept.append(s)
        clock["t"] += s

    monkeypatch.setattr(aio.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(aio.asyncio, "sleep", fake_sleep)
    lim = aio.RateLimiter(per_minute=60)  # one per second, burst of 60

    async def go():
        for _ in range(62):
            await lim.acquire(1)

    asyncio.run(go())
    assert len(slept) == 2 and all(abs(s - 1.0) < 1e-9 for s in slept)
    assert clock["t"] == 2.0


def test_joined_turns_train_every_answer_in_one_sequence(tmp_path):
    """``turns = "joined"``: MT-Bench asked on-policy, one sample per conversation. Checked
    against the engine's own ids for turn 2 (its prompt holds the model's turn-1 answer as the
    engine rendered it): the sample's ids are that prompt and answer, and exactly the two
    answers are trained. A conversation whose turn-1 answer was cut by length is dropped."""
    rows = [
        json.loads(line) for line in (PROMPTS / "mt_bench_question.jsonl").read_text().splitlines()
    ]
    src = tmp_path / "mt.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    greedy = [r for r in GT if r["id"].endswith("-greedy")]
    first = {r["messages"][0]["content"]: r for r in greedy if r["source"] == "mtbench"}
    second = {r["messages"][0]["content"]: r for r in greedy if r["source"] == "mtbench_turn2"}
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=len(rows), reader="mtbench", turns="joined")
        r = run("generate", str(m), "--quiet")
    assert "Traceback" not in r.stderr, r.stderr
    from draftdata.store.ledger import Ledger

    led = Ledger.read(tmp_path / "run" / "ledger.sqlite")
    text_of = {p.id: p.messages[0].content for p in led.prompts.of("gt")}
    samples = {text_of[s.key.prompt_id]: s for s in led.samples.of("gt")}
    # earlier turns have no sample of their own: one per conversation, keyed by its last turn
    assert len(samples) == len(list(led.samples.of("gt")))
    checked = exact = truncated = 0
    for text, t2 in second.items():
        t1 = first.get(text)
        if t1 is None:
            continue
        if t1["finish_reason"] == "length":
            truncated += 1
            assert text not in samples
            continue
        s = samples[text]
        assert s.key.turn == 1
        checked += 1
        if s.input_ids != t2["prompt_ids"] + t2["output_ids"]:
            continue
        exact += 1
        a1 = len(t1["prompt_ids"])
        spans = [(a1, a1 + len(t1["output_ids"])), (len(t2["prompt_ids"]), len(s.input_ids))]
        want = [any(a <= i < b for a, b in spans) for i in range(len(s.input_ids))]
        assert s.loss_mask == want
    assert checked >= 10 and exact >= 8, (checked, exact)
    dropped = [
        text_of[pid]
        for (pid,) in led.db.execute("SELECT prompt_id FROM drops WHERE reason='history_truncated'")
    ]
    assert truncated > 0 and len(dropped) >= truncated, (dropped, truncated)
    assert all(first[t]["finish_reason"] == "length" for t in dropped), dropped


def test_the_tokens_stage_over_two_workers_stores_what_one_process_stores(tmp_path):
    """A run's stored answers through forked workers, windows of 16 (several per worker): the
    same samples (every column, packed as stored) and the same drops as in one process."""
    from draftdata.config import load_manifest
    from draftdata.session import Run

    src, _ = greedy_subset(tmp_path, 60)
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=60, turns="all")
        assert run("generate", str(m), "--quiet").returncode == 0
    db_path = tmp_path / "run" / "ledger.sqlite"
    with Run.open(load_manifest(m), write=True) as opened:
        d = opened.manifest.datasets[0]
        keys = opened.ledger.samples.keys(d.name)
        stage = opened.tokens_stage(opened.target, None)
        got = {}
        for jobs in (1, 2):
            with opened.ledger.tx():
                opened.ledger.samples.forget(list(keys))
            made = stage.make(d, jobs=jobs, window=16)
            db = sqlite3.connect(db_path)
            got[jobs] = (
                made,
                db.execute("SELECT * FROM samples ORDER BY 1, 2, 3, 4").fetchall(),
                db.execute(
                    "SELECT * FROM drops WHERE stage='tokens' ORDER BY 1, 2, 3, 4"
                ).fetchall(),
            )
            db.close()
    assert len(got[1][1]) >= 60 and got[1][0].samples
    assert got[1] == got[2]
