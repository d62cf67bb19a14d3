"""Manifest validation, the SQLite ledger, the retry policy and on-policy turn building."""

from __future__ import annotations

import random
import sqlite3

import pytest

from draftdata.config import ManifestError, load_manifest
from draftdata.generate.backends.retry import backoff, retry_after, retry_delay, should_retry
from draftdata.records import ApiView, Completion, FailedAttempt, Key, Message, Prompt
from draftdata.store.ledger import Ledger
from draftdata.store.stats import status
from draftdata.tokens.history import turn_messages

GOOD = """
[run]
name = "t"
output = "runs/t"
budget_usd = 1.0

[target]
tokenizer = "tok"
format = "chatml"

[backends.api]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
concurrency = 8

[[datasets]]
name = "mt"
source = "mt.jsonl"
reader = "mtbench"
backend = "api"
sampling = { temperature = 0.0, max_tokens = 16 }
"""


def write(tmp_path, text):
    p = tmp_path / "m.toml"
    p.write_text(text)
    return p


def test_good_manifest_resolves_paths_relative_to_itself(tmp_path):
    m = load_manifest(write(tmp_path, GOOD))
    assert m.output_dir == tmp_path / "runs" / "t"
    assert m.resolve("mt.jsonl") == tmp_path / "mt.jsonl"
    assert m.backends["api"].concurrency == 8  # type: ignore[union-attr]
    assert m.datasets[0].sampling.max_tokens == 16


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            ("concurrency = 8", "concurency = 8"),
            r"m.toml:14: unknown key 'backends.api.concurency'; did you mean 'concurrency'\?",
        ),
        (
            ("concurrency = 8", "concurrency = 0"),
            r"m.toml:14: backends.api.concurrency: Input should be greater than or equal to 1",
        ),
        (
            ('backend = "api"', 'backend = "nope"'),
            r"m.toml:20: datasets.mt.backend = 'nope' is not defined",
        ),
        (('kind = "openai"', 'kind = "openia"'), r"m.toml:12: backends.api.kind = 'openia'"),
        (
            ('reader = "mtbench"', 'reader = "mtbnch"'),
            r"m.toml:19: datasets.mt.reader = 'mtbnch' is not a reader; did you mean 'mtbench'\? "
            r"choose one of bfcl, glaive, humaneval, magicoder-evol, magicoder-oss, mtbench, "
            r"openai, openai-messages, parquet, sharegpt, ultrachat, writingbench$",
        ),
        (("temperature = 0.0", "temperature = -1"), r"datasets.0.sampling.temperature"),
        (('name = "t"\n', ""), r"run.name is required"),
        (
            ('base_url = "http://127.0.0.1:9/v1"', 'base_url = "127.0.0.1:9"'),
            r"must start with http",
        ),
    ],
)
def test_bad_manifests_name_file_line_key_and_fix(tmp_path, change, needle):
    with pytest.raises(ManifestError, match=needle):
        load_manifest(write(tmp_path, GOOD.replace(*change)))


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no such manifest"):
        load_manifest(tmp_path / "none.toml")


def _answer(cost_usd: float = 0.0) -> Completion:
    """A stored answer as a backend hands it over (its content does not matter here)."""
    return Completion(
        request={"x": 1},
        response={"choices": []},
        response_text="{}",
        finish_reason="stop",
        view=ApiView("hi", "stop"),
        cost_usd=cost_usd,
        http_status=200,
    )


def test_ledger_stores_once_and_counts(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    p = Prompt("p1", "d", (Message("user", "hi"),))
    led.prompts.add("d", [p], samples=2, turns=lambda _: 1)
    k = Key("d", "p1", 0, 0)
    led.answers.record_failure(
        k, "api", FailedAttempt("http_429", 429, {"x": 1}, "slow down", 0, 0.1, final=False)
    )
    answer = _answer(cost_usd=0.5)
    led.answers.record_one(k, "api", answer, [1, 2, 3])
    st = status(led).dataset("d")
    assert (st.total, st.done, st.pending, st.failed) == (2, 1, 1, 0)
    assert st.errors == {"http_429": 1} and st.duplicates == 0
    assert status(led).cost_usd == 0.5
    # a second success for the same key is an attempt (counted as a duplicate), never a 2nd row
    led.answers.record_one(k, "api", answer, [1, 2, 3])
    assert status(led).dataset("d").duplicates == 1
    assert len(led.answers.of("d")) == 1
    assert led.answers.of("d")[k].our_prompt_ids == (1, 2, 3)
    led.close()
    assert (
        sqlite3.connect(tmp_path / "l.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    )


def test_ledger_refuses_a_foreign_file(tmp_path):
    from draftdata.store.ledger import LedgerError

    bad = tmp_path / "x.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    with pytest.raises(LedgerError, match="move it aside"):
        Ledger(bad)


def test_retry_policy():
    assert should_retry(None) and should_retry(429) and should_retry(503) and should_retry(408)
    assert not should_retry(400) and not should_retry(401) and not should_retry(404)
    assert retry_after({"Retry-After": "2"}) == 2.0
    assert retry_after({"retry-after-ms": "50", "Retry-After": "2"}) == 0.05
    assert retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after({}) is None
    rng = random.Random(0)
    delays = [backoff(a, rng) for a in range(8)]
    assert all(0.75 * min(0.5 * 2**a, 60) <= d <= min(0.5 * 2**a, 60) for a, d in enumerate(delays))
    assert retry_delay(3, {"retry-after": "1"}, rng) == 1.0
    # a backend's backoff_s sets the first wait; a server's Retry-After still wins
    assert all(0.75 * 0.05 * 2**a <= backoff(a, rng, 0.05) <= 0.05 * 2**a for a in range(6))
    assert retry_delay(3, {"retry-after": "1"}, rng, 0.05) == 1.0


def test_on_policy_turns_use_the_models_own_answers():
    p = Prompt(
        "x",
        "d",
        (
            Message("system", "S"),
            Message("user", "Q1"),
            Message("assistant", "dataset answer"),
            Message("user", "Q2"),
        ),
    )
    mine = [Message("assistant", "my answer")]
    assert [m.content for m in turn_messages(p, "all", 0, [])] == ["S", "Q1"]
    assert [m.content for m in turn_messages(p, "all", 1, mine)] == ["S", "Q1", "my answer", "Q2"]
    assert [m.content for m in turn_messages(p, "last", 0, [])] == [
        "S",
        "Q1",
        "dataset answer",
        "Q2",
    ]
    assert [m.content for m in turn_messages(p, "first", 0, [])] == ["S", "Q1"]


def test_answers_are_committed_in_groups_and_each_is_durable_before_it_returns(tmp_path):
    """Answers arriving together are committed in groups, not one transaction each; when an
    answer's ``put`` returns, a second connection (another process's view) already sees it done;
    a commit that fails reaches every answer of its group. The groups asserted do not depend on
    the machine's speed: answers queued in one turn of the event loop are all queued before the
    group's timer can fire, and answers spread over several turns are grouped by the size
    bound, under a timer that no machine reaches."""
    import asyncio

    from draftdata.generate.commits import GroupCommit
    from draftdata.store.ledger import LedgerError

    led = Ledger(tmp_path / "l.sqlite")
    ps = [Prompt(f"p{i}", "d", (Message("user", f"q{i}"),)) for i in range(64)]
    led.prompts.add("d", ps, samples=1, turns=lambda _: 1)
    answer = _answer()
    commits = []
    real = led.answers.record
    led.answers.record = lambda group: (commits.append(len(group)), real(group))[1]  # type: ignore[method-assign]
    other = sqlite3.connect(tmp_path / "l.sqlite")

    def done(pid: str) -> bool:
        q = "SELECT state FROM work WHERE prompt_id=?"
        return other.execute(q, (pid,)).fetchone()[0] == "done"

    async def go(group: GroupCommit, first: int, turns: int) -> list[bool]:
        async def one(i: int) -> bool:
            for _ in range(i % turns):  # arriving over `turns` turns of the loop, not at once
                await asyncio.sleep(0)
            await group.put((Key("d", f"p{i}", 0, 0), "api", answer, [1]))
            return done(f"p{i}")

        return await asyncio.gather(*(one(i) for i in range(first, first + 24)))

    # 24 answers in one turn: one transaction, when the group's 5 ms timer fires
    assert all(asyncio.run(go(GroupCommit(led, delay_s=0.005), 0, turns=1)))
    assert commits == [24]
    # 24 answers over 4 turns, groups of at most 8: three full groups (the timer never fires)
    assert all(asyncio.run(go(GroupCommit(led, delay_s=30, most=8), 24, turns=4)))
    assert commits == [24, 8, 8, 8]

    def broken(group):
        raise LedgerError("the disk is full")

    led.answers.record = broken  # type: ignore[method-assign]

    async def failing() -> list[BaseException | None]:
        g = GroupCommit(led)
        return await asyncio.gather(
            *(g.put((Key("d", f"p{i}", 0, 0), "api", answer, [1])) for i in range(48, 52)),
            return_exceptions=True,
        )

    got = asyncio.run(failing())
    assert all(isinstance(e, LedgerError) for e in got), got
    assert not any(done(f"p{i}") for i in range(48, 52))


def test_pending_conversations_page_through_the_dataset_in_source_order(tmp_path):
    """A run pages through its dataset: every conversation with a turn left comes once, in
    the order the source gave the prompts (not their ids' order), with its answered turns
    counted; finished ones never come back."""
    led = Ledger(tmp_path / "l.sqlite")
    ids = [f"p{(i * 7) % 20:02d}" for i in range(20)]  # source order is not id order
    ps = [Prompt(pid, "d", (Message("user", pid),)) for pid in ids]
    n = led.prompts.add("d", iter(ps), samples=2, turns=lambda _: 2)
    assert n == 20 and led.prompts.count("d") == 20
    answer = _answer()
    # conversation (p00, 0) finished; (p07, 1) half done
    led.answers.record(
        [
            (Key("d", "p00", 0, 0), "api", answer, [1]),
            (Key("d", "p00", 0, 1), "api", answer, [1]),
            (Key("d", "p07", 1, 0), "api", answer, [1]),
        ]
    )
    assert led.prompts.work_counts("d") == (80, 77)
    got, after = [], -1
    while True:
        page = led.prompts.pending_chains("d", after, 7)
        if page.next_after is None:
            break
        got += [(c.prompt.id, c.sample, c.answered) for c in page.chains]
        after = page.next_after
    want = [(pid, s) for pid in ids for s in range(2) if (pid, s) != ("p00", 0)]
    assert [(pid, s) for pid, s, _ in got] == want
    assert [k for pid, s, k in got if (pid, s) == ("p07", 1)] == [1]
    assert sum(k for *_, k in got) == 1
    assert set(led.answers.of_chain("d", "p07", 1)) == {0}


def _meta_key(name: str):
    """The declared record of a meta row, by its stored key."""
    from draftdata.store import meta

    fixed = (
        meta.SCHEMA_VERSION,
        meta.MIGRATED_FROM,
        meta.MANIFEST,
        meta.MANIFEST_BASE_DIR,
        meta.COMMAND_LINE,
        meta.GATE,
    )
    per = (meta.SETTINGS, meta.LIMIT, meta.READ_DROPS, meta.CONTAMINATION, meta.USAGE_NOTES)
    prefix, _, dataset = name.partition(":")
    if dataset:
        return next(p for p in per if p.prefix == prefix).of(dataset)
    return next(k for k in fixed if k.key == name)


@pytest.mark.parametrize("run", ["v2", "v3"])
def test_meta_records_of_older_ledgers_read_typed_and_write_back_the_same_text(tmp_path, run):
    """Every meta row of a ledger written by an earlier draftdata (tests/data) reads as its
    typed record, and that record written again is the very text the old draftdata wrote."""
    import json
    import shutil

    from conftest import ROOT

    shutil.copy(ROOT / "tests" / "data" / f"ledger-{run}.sqlite", tmp_path / "l.sqlite")
    db = sqlite3.connect(tmp_path / "l.sqlite")
    rows = db.execute("SELECT key, value FROM meta").fetchall()
    db.close()
    assert {k.partition(":")[0] for k, _ in rows} >= {"schema_version", "manifest", "gate"}
    for key, text in rows:
        k = _meta_key(key)
        assert json.dumps(k.dump(k.load(json.loads(text)))) == text, key
    led = Ledger.read(tmp_path / "l.sqlite")
    try:  # read through the part as the stages read them
        from draftdata.store.meta import GATE, MANIFEST, READ_DROPS

        gate = led.meta.get(GATE)
        assert gate is not None and gate.passed and gate.evidence is None
        assert led.meta.get(READ_DROPS.of("truth"), {"missing": 1}) == {}
        assert (led.meta.get(MANIFEST) or {})["run"]["name"] == run
    finally:
        led.close()


def test_meta_records_are_the_json_the_stages_wrote_before_they_were_typed(tmp_path):
    """The gate and the contamination tally a stage records are stored as the JSON it wrote
    before (``Gate.to_json``; the tally's old ``to_json``, spelled out here), key order
    included; a meta value that is not its record is one LedgerError naming the key."""
    import json

    from draftdata.measure.contamination import Match, Tally
    from draftdata.measure.gate import Gate
    from draftdata.store.ledger import LedgerError
    from draftdata.store.meta import CONTAMINATION, GATE, contamination_json, gate_json

    for g in (Gate(0.9, 0.95, True, reason="r", evidence="ground truth"), Gate(0.9, None, False)):
        assert json.dumps(gate_json(g.record())) == json.dumps(g.to_json())
    t = Tally()
    t.add("p1", Match("mt-bench", "81", 0.876543, 7, 8, "ngram", True))
    t.add("p2", None)
    want = {
        "checked": 2,
        "flagged": 1,
        "by_set": {"mt-bench": 1},
        "first": [
            {
                "prompt_id": "p1",
                "eval_set": "mt-bench",
                "eval_id": "81",
                "score": 0.8765,
                "rule": "ngram",
            }
        ],
    }
    assert json.dumps(contamination_json(t.record())) == json.dumps(want)
    assert Tally.of_record(t.record()).record() == t.record()
    led = Ledger(tmp_path / "l.sqlite")
    try:
        led.meta.put(CONTAMINATION.of("d"), t.record())
        led.meta.put(GATE, Gate(0.9, 0.95, True).record())
        (text,) = led.db.execute("SELECT value FROM meta WHERE key='contamination:d'").fetchone()
        assert text == json.dumps(want)
        assert led.meta.get(CONTAMINATION.of("d")) == t.record()
        led.db.execute("UPDATE meta SET value='\"passed\"' WHERE key='gate'")
        with pytest.raises(LedgerError, match="'gate'"):
            led.meta.get(GATE)
    finally:
        led.close()


def test_the_prompts_stage_renders_in_chunks_bounded_by_count_and_characters():
    """A chunk of prompts is rendered to first-turn ids at once; 512 WritingBench prompts
    (14 KB each) held 67 MB of ints, so a chunk also closes at CHUNK_CHARS characters."""
    from draftdata.store import prompts as sp

    def made(n: int, chars: int) -> list[Prompt]:
        return [Prompt(f"p{i}", "d", (Message("user", "x" * chars),)) for i in range(n)]

    small = [len(c) for c in sp._chunks(made(1100, 10))]
    assert small == [sp.CHUNK, sp.CHUNK, 1100 - 2 * sp.CHUNK]
    big = sp.CHUNK_CHARS // 8  # eight of these fill a chunk
    sizes = [len(c) for c in sp._chunks(made(20, big))]
    assert sizes == [8, 8, 4]
    ids = [p.id for c in sp._chunks(made(20, big)) for p in c]
    assert ids == [f"p{i}" for i in range(20)]  # every prompt once, in order


def test_a_page_holds_each_prompts_first_ids_as_one_array(tmp_path):
    """A page of 512 long prompts held their first-turn ids as lists of ints (36 bytes an id):
    they are read as one ``array('i')`` a prompt (4 bytes an id), shared by its samples, with
    the ids that were stored (past int16 and near int32's top too)."""
    from array import array

    led = Ledger(tmp_path / "l.sqlite")
    ps = [Prompt(f"p{i}", "d", (Message("user", f"q{i}"),)) for i in range(3)]
    rendered = {p.id: [i, 70_000 + i, 2**31 - 1 - i] for i, p in enumerate(ps)}
    try:
        led.prompts.add(
            "d", ps, 2, lambda p: 1, render=lambda chunk: [rendered[p.id] for p in chunk]
        )
        page = led.prompts.pending_chains("d", -1, 10)
    finally:
        led.close()
    assert len(page.chains) == 6
    for c in page.chains:
        assert isinstance(c.first_ids, array) and c.first_ids.typecode == "i"
        assert list(c.first_ids) == rendered[c.prompt.id]
    assert page.chains[0].first_ids is page.chains[1].first_ids  # the prompt's two samples
