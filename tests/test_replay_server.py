"""The replay server over real HTTP on loopback: matching, token ids, errors, seeded faults."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from conftest import GROUNDTRUTH
from draftdata.devtools.replay import (
    FAULT_KINDS,
    choose_fault,
    load_records,
    make_app,
    parse_faults,
    serve,
    serve_in_thread,
)
from draftdata.errors import InputError
from draftdata.records.wire import reasoning_of

Records = list[dict[str, Any]]
Server = Callable[..., AbstractContextManager[httpx.Client]]


@pytest.fixture(scope="module")
def records() -> Records:
    recs, skipped = load_records(GROUNDTRUTH)
    assert skipped == {}
    return recs


@pytest.fixture(scope="module")
def by_id(records: Records) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in records}


@pytest.fixture
def server(records: Records) -> Iterator[Server]:
    """server(**make_app kwargs) -> context manager yielding an httpx.Client on its base URL."""

    @contextmanager
    def _start(**kwargs: Any) -> Iterator[httpx.Client]:
        app = make_app(records, **kwargs)
        with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=5) as client:
            yield client

    yield _start


def chat(client: httpx.Client, messages: Any, **extra: Any) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": "m", "messages": messages, **extra})


def _until(ready: Callable[[], bool], what: str) -> None:
    """Wait for a readiness condition (a request the server has counted, headers that
    arrived), polling; a test asserts order and counts, never a time."""
    for _ in range(4000):
        if ready():
            return
        time.sleep(0.005)
    pytest.fail(f"never happened: {what}")


def _attempts(c: httpx.Client) -> int:
    return int(c.get("/stats").json()["attempts"])


# ---------------------------------------------------------------- matching


def test_greedy_and_sample_records_are_picked_by_temperature(
    server: Server, by_id: dict[str, dict[str, Any]]
) -> None:
    greedy, sample = by_id["mtbench-0-greedy"], by_id["mtbench-0-sample"]
    assert greedy["messages"] == sample["messages"]
    with server() as c:
        for extra, rec in (
            ({}, greedy),
            ({"temperature": 0}, greedy),
            ({"temperature": 0.8}, sample),
        ):
            r = chat(c, rec["messages"], **extra)
            assert r.status_code == 200
            assert r.headers["x-replay-record"] == rec["id"]
            assert "x-replay-fault" not in r.headers
            body = r.json()
            assert body["object"] == "chat.completion"
            assert body["model"] == "m"
            assert body["id"].startswith("chatcmpl-")
            assert isinstance(body["created"], int)
            (choice,) = body["choices"]
            assert choice["message"] == {"role": "assistant", "content": rec["api_view"]["content"]}
            assert choice["finish_reason"] == rec["api_view"]["finish_reason"]
            assert choice["logprobs"] is None
            assert "token_ids" not in choice
            n_in, n_out = len(rec["prompt_ids"]), len(rec["output_ids"])
            assert body["usage"] == {
                "prompt_tokens": n_in,
                "completion_tokens": n_out,
                "total_tokens": n_in + n_out,
            }


def test_messages_are_matched_on_role_and_content_only(
    server: Server, by_id: dict[str, dict[str, Any]]
) -> None:
    rec = by_id["mtbench_turn2-0-greedy"]
    parts = [
        {
            "role": m["role"],
            "content": [{"type": "text", "text": m["content"][:5]}, {"text": m["content"][5:]}],
            "name": "ignored",
        }
        for m in rec["messages"]
    ]
    with server() as c:
        r = chat(c, parts)
        assert r.status_code == 200
        assert r.headers["x-replay-record"] == rec["id"]


def test_only_sample_variant_serves_greedy_requests_too(
    server: Server, records: Records, by_id: dict[str, dict[str, Any]]
) -> None:
    keys = Counter(json.dumps(r["messages"], sort_keys=True) for r in records)
    lone = next(r for r in records if keys[json.dumps(r["messages"], sort_keys=True)] == 1)
    with server() as c:
        for t in (0, 1.0):
            assert chat(c, lone["messages"], temperature=t).headers["x-replay-record"] == lone["id"]


def test_return_token_ids_gives_the_exact_ids(
    server: Server, by_id: dict[str, dict[str, Any]]
) -> None:
    greedy = [r for r in by_id.values() if r["id"].endswith("-greedy")]
    stop = next(r for r in greedy if r["finish_reason"] == "stop")
    length = next(r for r in greedy if r["finish_reason"] == "length")
    sample = next(r for r in by_id.values() if r["id"].endswith("-sample"))
    with server(token_ids=True) as c:
        for rec, temperature in ((stop, 0.0), (length, 0.0), (sample, 0.8)):
            r = chat(c, rec["messages"], return_token_ids=True, temperature=temperature)
            assert r.headers["x-replay-record"] == rec["id"]
            body = r.json()
            assert body["prompt_token_ids"] == rec["prompt_ids"]
            assert body["choices"][0]["token_ids"] == rec["output_ids"]
        assert stop["output_ids"][-1] == 2  # the end-of-turn id is kept, as in the record
        plain = chat(c, stop["messages"]).json()
        assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    with server(token_ids=False) as c:  # the extension is off unless the server turns it on
        body = chat(c, stop["messages"], return_token_ids=True).json()
        assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]


def test_errors_and_other_routes(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    msgs = by_id["mtbench-0-greedy"]["messages"]
    with server() as c:
        r = chat(c, [{"role": "user", "content": "not in the ground truth"}])
        assert r.status_code == 404
        assert r.json() == {
            "error": {"message": "no ground-truth record for these messages", "type": "not_found"}
        }
        r = c.post(
            "/v1/chat/completions",
            content=b'{"messages": [',
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        assert chat(c, "hello").status_code == 400
        assert chat(c, [{"content": "no role"}]).status_code == 400
        r = chat(c, msgs, stream=True)
        assert r.status_code == 400 and "streaming" in r.json()["error"]["message"]
        assert c.get("/v1/models").json() == {
            "object": "list",
            "data": [{"id": "replay", "object": "model"}],
        }
        assert c.get("/health").status_code == 200
        assert c.get("/v1/nothing").json()["error"]["type"] == "not_found"
        stats = c.get("/stats").json()
        assert stats["requests"] == 5
        assert stats["by_status"] == {"400": 4, "404": 1}
        assert stats["attempts"] == 0


# ---------------------------------------------------------------- fault spec


def test_parse_faults_normalises_order() -> None:
    assert parse_faults(None) == {} == parse_faults("  ")
    parsed = parse_faults(" tools=0.1, 429=0.25 ,slow=0")
    assert parsed == {"429": 0.25, "slow": 0.0, "tools": 0.1}
    assert list(parsed) == ["429", "slow", "tools"]
    assert parse_faults(",".join(f"{k}=0.05" for k in FAULT_KINDS)) == dict.fromkeys(
        FAULT_KINDS, 0.05
    )


def test_new_kinds_keep_old_seeds() -> None:
    old = ("429", "500", "slow", "truncated", "empty", "length", "reasoning", "tools")
    assert FAULT_KINDS[: len(old)] == old  # new kinds are appended: old draws walk the same
    spec = parse_faults("429=0.2,500=0.1,slow=0.1,empty=0.1,tools=0.1")
    with_new = parse_faults("429=0.2,500=0.1,slow=0.1,empty=0.1,tools=0.1,cut=0,401=0,huge=0")
    for i in range(200):
        for attempt in (1, 2, 3):
            rid = f"r{i}"
            assert choose_fault(spec, 4, rid, attempt) == choose_fault(with_new, 4, rid, attempt)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("bogus=0.1", "unknown fault kind 'bogus'; valid: 429, 500, slow"),
        ("429=1.5", "outside [0, 1]"),
        ("429=-0.1", "outside [0, 1]"),
        ("429=nan", "outside [0, 1]"),
        ("429=lots", "'lots' is not a number"),
        ("429", "write KIND=RATE"),
        ("429=0.1,429=0.2", "given twice"),
        ("429=0.6,500=0.5", "sum to 1.1"),
    ],
)
def test_parse_faults_errors_name_the_item(spec: str, needle: str) -> None:
    with pytest.raises(InputError) as info:
        parse_faults(spec)
    assert needle in str(info.value)


def test_make_app_checks_its_inputs(records: Records) -> None:
    with pytest.raises(InputError, match="slow-seconds"):
        make_app(records, slow_seconds=-1)
    with pytest.raises(InputError, match="unknown fault kind"):
        make_app(records, {"teapot": 0.1})
    with pytest.raises(InputError, match="no usable ground-truth records"):
        make_app([{"id": "x"}])


# ---------------------------------------------------------------- faults


def test_rate_limit_everywhere(server: Server, records: Records) -> None:
    with server(faults="429=1") as c:
        for rec in records[:20]:
            r = chat(c, rec["messages"])
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"
            assert r.headers["retry-after-ms"] == "50"
            assert r.headers["x-replay-fault"] == "429"
            assert r.json()["error"]["type"] == "rate_limit_error"
        stats = c.get("/stats").json()
        assert stats["by_status"] == {"429": 20}
        assert stats["faults"]["429"] == 20


def _fault_sequence(c: httpx.Client, plan: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    out = []
    for rec in plan:
        r = chat(c, rec["messages"])
        out.append((r.headers["x-replay-record"], r.headers.get("x-replay-fault")))
    return out


def test_faults_are_reproducible_from_seed_record_and_attempt(
    server: Server, records: Records
) -> None:
    spec = "429=0.2,500=0.1,truncated=0.1,empty=0.1,length=0.1,reasoning=0.1,tools=0.1"
    greedy = [r for r in records if r["id"].endswith("-greedy")][:25]
    plan = greedy * 3  # each record three times: attempts 1, 2, 3
    with server(faults=spec, seed=7) as c:
        first = _fault_sequence(c, plan)
    # a second instance sees the records in another order: each (record, attempt) keeps its fault
    with server(faults=spec, seed=7) as c:
        second = _fault_sequence(c, list(reversed(greedy)) + greedy[::-1] + greedy[::-1])
    attempts: Counter[str] = Counter()
    expected = {}
    for rid, fault in first:
        attempts[rid] += 1
        expected[(rid, attempts[rid])] = fault
    attempts.clear()
    for rid, fault in second:
        attempts[rid] += 1
        assert expected[(rid, attempts[rid])] == fault

    # the documented rule, computed independently of the server
    rates = parse_faults(spec)
    for (rid, attempt), fault in expected.items():
        u = random.Random(f"7:{rid}:{attempt}").random()
        cum, want = 0.0, None
        for kind, rate in rates.items():
            cum += rate
            if u < cum:
                want = kind
                break
        assert fault == want == choose_fault(rates, 7, rid, attempt)
    assert len({f for f in expected.values()}) >= 5
    with server(faults=spec, seed=8) as c:
        assert _fault_sequence(c, plan) != first


def test_slow_only_on_first_attempt(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    """A slow fault holds an answer on its first attempt only, and holds no other request:
    shown by the order answers finish in, not by a clock. While a patient client waits on one
    record's slow answer, another record's retry is served whole; the slow one comes after."""
    rec, other = by_id["humaneval-0-greedy"], by_id["humaneval-1-greedy"]
    with server(faults="slow=1", slow_seconds=2.0) as c:
        with pytest.raises(httpx.ReadTimeout):  # attempt 1 is slow: an impatient client gives up
            c.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": rec["messages"]},
                timeout=httpx.Timeout(5, read=0.3),
            )
        slow_done = threading.Event()
        slow: list[httpx.Response] = []

        def patient() -> None:  # a patient client gets the slow answer in full
            try:
                with httpx.Client(base_url=c.base_url, timeout=30) as c2:
                    slow.append(chat(c2, other["messages"]))
            finally:
                slow_done.set()

        waiter = threading.Thread(target=patient)
        waiter.start()
        try:
            _until(lambda: _attempts(c) == 2, "the server took the slow request")
            assert not slow_done.is_set(), "the slow answer came at once"
            r = chat(c, rec["messages"])  # the retry is attempt 2: not slow
            assert not slow_done.is_set(), "the retry was served only after the slow answer"
        finally:
            waiter.join(30)
        assert r.status_code == 200 and "x-replay-fault" not in r.headers
        assert r.json()["choices"][0]["message"]["content"] == rec["api_view"]["content"]
        (s,) = slow
        assert s.status_code == 200 and s.headers["x-replay-fault"] == "slow"
        assert s.json()["choices"][0]["message"]["content"] == other["api_view"]["content"]
        stats = c.get("/stats").json()
        assert stats["faults"]["slow"] == 2 and stats["attempts"] == 3


def test_truncated_body_is_not_json(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    rec = by_id["mtbench-0-greedy"]
    with server() as c:
        whole = chat(c, rec["messages"]).content
    with server(faults="truncated=1") as c:
        r = chat(c, rec["messages"])
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert len(r.content) == len(whole) // 2
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.content)


def test_message_faults(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    rec = by_id["bfcl-0-greedy"]
    content = rec["api_view"]["content"]
    kw: dict[str, Any] = {"token_ids": True}
    with server(faults="empty=1", **kw) as c:
        body = chat(c, rec["messages"], return_token_ids=True).json()
        assert body["choices"][0]["message"]["content"] == ""
        assert body["choices"][0]["finish_reason"] == "stop"
        assert "token_ids" not in body["choices"][0]  # altered text never comes with ids
        assert body["prompt_token_ids"] == rec["prompt_ids"]
    with server(faults="length=1", **kw) as c:
        choice = chat(c, rec["messages"]).json()["choices"][0]
        assert choice["message"]["content"] == content[: len(content) // 2]
        assert choice["finish_reason"] == "length"
    with server(faults="tools=1", **kw) as c:
        choice = chat(c, rec["messages"]).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] is None
        (call,) = choice["message"]["tool_calls"]
        assert call["function"] == {"name": "lookup", "arguments": '{"q": "x"}'}
        assert json.loads(call["function"]["arguments"]) == {"q": "x"}
    with server(faults="reasoning=1", **kw) as c:
        shapes = set()
        for _ in range(6):
            msg = chat(c, rec["messages"]).json()["choices"][0]["message"]
            assert msg["content"] == content
            text, field = reasoning_of(msg)
            assert text == "Let me think."
            shapes.add(field)
        assert shapes == {"reasoning_content", "reasoning", "reasoning_details"}


def test_fault_mix_matches_rates(server: Server, records: Records) -> None:
    n = 300
    plan = [records[i % 150] for i in range(n)]  # 150 records, two attempts each
    with server(faults="429=0.2,500=0.1,empty=0.1", seed=3) as c:
        seen = Counter(chat(c, rec["messages"]).headers.get("x-replay-fault") for rec in plan)
        stats = c.get("/stats").json()
    assert abs(seen["429"] / n - 0.2) < 0.07
    assert abs(seen["500"] / n - 0.1) < 0.05
    assert abs(seen["empty"] / n - 0.1) < 0.05
    assert set(seen) <= {None, "429", "500", "empty"}
    assert stats["requests"] == stats["attempts"] == n
    assert stats["by_status"] == {
        "200": n - seen["429"] - seen["500"],
        "429": seen["429"],
        "500": seen["500"],
    }
    assert {k: v for k, v in stats["faults"].items() if v} == {
        k: v for k, v in seen.items() if k is not None
    }


# ---------------------------------------------------------------- loading and serve()


def test_load_records_counts_what_it_skips(tmp_path: Path) -> None:
    good = GROUNDTRUTH.read_text(encoding="utf-8").splitlines()[:3]
    path = tmp_path / "gt.jsonl"
    path.write_text("\n".join([*good, "{broken", "[1, 2]", '{"id": "x"}', ""]) + "\n")
    recs, skipped = load_records(path)
    assert [r["id"] for r in recs] == [json.loads(line)["id"] for line in good]
    assert skipped == {"malformed_json": 1, "not_an_object": 1, "bad_record": 1}
    with pytest.raises(InputError, match="cannot read"):
        load_records(tmp_path / "missing.jsonl")


def test_serve_runs_as_a_process(tmp_path: Path) -> None:
    path = tmp_path / "gt.jsonl"
    lines = GROUNDTRUTH.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join([*lines[:10], "not json"]) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import sys; from pathlib import Path; from draftdata.devtools.replay import serve; "
        f"serve(Path(sys.argv[1]), '127.0.0.1', {port}, '500=0.5', 1, True, 0.1)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stderr=subprocess.PIPE, text=True
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert proc.poll() is None, "the server exited before it was ready"
            try:
                return httpx.get(base + "/health").status_code == 200
            except httpx.TransportError:
                return False

        _until(healthy, "the server answers /health")
        rec = json.loads(lines[0])
        r = httpx.post(base + "/v1/chat/completions", json={"messages": rec["messages"]})
        assert r.headers["x-replay-record"] == rec["id"]
        with pytest.raises(InputError, match="cannot listen"):  # the port is taken now
            serve(path, "127.0.0.1", port)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "10 records" in err and "skipped 1 (malformed_json 1)" in err
    assert "faults 500=0.5" in err


# ---------------------------------------------------------------- hostile network, broken server


class _Aio:
    """What an aiohttp client (the project's own HTTP client) got for one request."""

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        body: bytes,
        error: Exception | None,
        chunks: int = 0,
    ):
        self.status, self.headers, self.body, self.error = status, headers, body, error
        self.chunks = chunks  # how many reads the body arrived in

    def json(self) -> Any:
        assert self.error is None, self.error
        return json.loads(self.body)


def aio_chats(
    c: httpx.Client,
    plan: list[Any],
    timeout: float = 10.0,
    headers_in: threading.Event | None = None,
    **extra: Any,
) -> list[_Aio]:
    """POST each messages list of ``plan`` in turn with aiohttp, reading the body in chunks;
    a body that breaks or times out keeps what arrived and the exception. ``headers_in`` is
    set once the first answer's headers and first body bytes have arrived."""

    async def go() -> list[_Aio]:
        out = []
        url = str(c.base_url).rstrip("/") + "/v1/chat/completions"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            for messages in plan:
                got = bytearray()
                chunks = 0
                error: Exception | None = None
                async with s.post(url, json={"model": "m", "messages": messages, **extra}) as r:
                    try:
                        while chunk := await r.content.read(1 << 16):
                            got += chunk
                            chunks += 1
                            if headers_in is not None:
                                headers_in.set()
                    except (aiohttp.ClientPayloadError, asyncio.TimeoutError) as e:
                        error = e
                    out.append(_Aio(r.status, dict(r.headers), bytes(got), error, chunks))
        return out

    return asyncio.run(go())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_cut_breaks_the_body_mid_way(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    rec = by_id["mtbench-0-greedy"]
    with server() as c:
        whole = chat(c, rec["messages"]).content
    log = _Records()
    logging.getLogger("uvicorn.error").addHandler(log)
    try:
        with server(faults="cut=1") as c:
            got = aio_chats(c, [rec["messages"]] * 2)
            with pytest.raises(httpx.RemoteProtocolError):  # httpx sees it too
                chat(c, rec["messages"])
            stats = c.get("/stats").json()  # the server itself is fine
    finally:
        logging.getLogger("uvicorn.error").removeHandler(log)
    for r in got:
        assert r.status == 200 and r.headers["x-replay-fault"] == "cut"
        assert r.headers["Content-Length"] == str(len(whole))
        assert isinstance(r.error, aiohttp.ClientPayloadError)
        assert "Not enough data" in str(r.error)
        half = len(whole) // 2  # the same answer, but for its id and created time
        assert len(r.body) == half and r.body[-40:] == whole[half - 40 : half]
    assert stats["faults"]["cut"] == 3 and stats["by_status"] == {"200": 3}
    assert not log.records  # an injected cut is not logged as an application error


def test_slowbody_times_out_mid_body(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    """A slowbody answer sends its headers at once and trickles its body, on the first attempt
    only, without holding other requests: shown by what arrived and in which order, not by a
    clock. A retry is served whole while another record's trickle is still under way."""
    rec, other = by_id["humaneval-0-greedy"], by_id["humaneval-1-greedy"]
    with server(faults="slowbody=1", slow_seconds=2.0) as c:
        (r,) = aio_chats(c, [rec["messages"]], timeout=0.25)
        assert r.status == 200 and r.headers["x-replay-fault"] == "slowbody"  # headers at once
        assert isinstance(r.error, asyncio.TimeoutError)  # ... the timeout hit mid-body
        assert 0 < len(r.body) < int(r.headers["Content-Length"])
        started, trickle_done = threading.Event(), threading.Event()
        trickled: list[_Aio] = []

        def patient() -> None:  # a patient client gets it all, slowly
            try:
                trickled.extend(aio_chats(c, [other["messages"]], headers_in=started))
            finally:
                trickle_done.set()

        waiter = threading.Thread(target=patient)
        waiter.start()
        try:
            _until(started.is_set, "the trickled answer's first piece")
            (r,) = aio_chats(c, [rec["messages"]])  # the retry is attempt 2: no fault
            assert not trickle_done.is_set(), "the retry was served only after the trickle"
        finally:
            waiter.join(30)
        assert "x-replay-fault" not in r.headers and r.chunks >= 1
        assert r.json()["choices"][0]["message"]["content"] == rec["api_view"]["content"]
        (t,) = trickled
        assert t.headers["x-replay-fault"] == "slowbody"
        assert t.chunks >= 2  # the body came in pieces, apart
        assert t.json()["choices"][0]["message"]["content"] == other["api_view"]["content"]
        stats = c.get("/stats").json()
    assert stats["faults"]["slowbody"] == 2 and stats["attempts"] == 3


def test_auth_errors_repeat_on_every_attempt(server: Server, records: Records) -> None:
    spec = "401=0.25,403=0.25,500=0.25"
    greedy = [r for r in records if r["id"].endswith("-greedy")][:40]
    with server(faults=spec, seed=5) as c:
        seen = {}
        for rec in greedy:
            rs = [chat(c, rec["messages"]) for _ in range(3)]
            seen[rec["id"]] = [(r.status_code, r.headers.get("x-replay-fault")) for r in rs]
            if rs[0].status_code in (401, 403):
                for r in rs:
                    assert r.content == rs[0].content
                    err = r.json()["error"]
                    assert set(err) == {"message", "type", "code"}
                    assert "injected fault" in err["message"]
                    if r.status_code == 401:
                        assert err["type"] == "invalid_request_error"
                        assert err["code"] == "invalid_api_key"
                    else:
                        assert (err["type"], err["code"]) == ("authentication_error", 403)
        stats = c.get("/stats").json()
    firsts = Counter(s[0][0] for s in seen.values())
    assert firsts[401] and firsts[403] and firsts[500] and firsts[200]
    rates = parse_faults(spec)
    for rid, answers in seen.items():
        if answers[0][0] in (401, 403):
            assert answers == [answers[0]] * 3  # a wrong key stays wrong
        else:  # a record not refused on attempt 1 never is
            assert all(status not in (401, 403) for status, _ in answers)
        for attempt, (_, fault) in enumerate(answers, 1):
            assert fault == choose_fault(rates, 5, rid, attempt)
    served = Counter(f for answers in seen.values() for _, f in answers if f)
    assert {k: v for k, v in stats["faults"].items() if v} == dict(served)
    assert stats["faults"]["401"] == 3 * firsts[401]


def test_malformed_answers(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    rec = by_id["bfcl-0-greedy"]
    content = rec["api_view"]["content"]
    kw: dict[str, Any] = {"token_ids": True}
    with server(faults="badtools=1", **kw) as c:
        shapes = set()
        for _ in range(4):
            body = chat(c, rec["messages"], return_token_ids=True).json()
            (choice,) = body["choices"]
            assert choice["finish_reason"] == "tool_calls"
            calls = choice["message"]["tool_calls"]
            assert not isinstance(calls, list)
            if isinstance(calls, str):
                assert json.loads(calls)[0]["function"]["name"] == "lookup"
            else:
                assert calls["function"]["name"] == "lookup"
            shapes.add(type(calls))
            assert "token_ids" not in choice and body["prompt_token_ids"] == rec["prompt_ids"]
        assert shapes == {str, dict}
    with server(faults="strmessage=1", **kw) as c:
        (choice,) = chat(c, rec["messages"], return_token_ids=True).json()["choices"]
        assert choice["message"] == content
        assert choice["finish_reason"] == rec["api_view"]["finish_reason"]
        assert "token_ids" not in choice
    with server(faults="nousage=1", **kw) as c:
        r = chat(c, rec["messages"], return_token_ids=True)
        assert r.headers["x-replay-fault"] == "nousage"
        body = r.json()
        assert "usage" not in body
        (choice,) = body["choices"]
        assert choice["message"] == {"role": "assistant", "content": content}
        assert choice["token_ids"] == rec["output_ids"]  # the message is intact: ids stay
        assert body["prompt_token_ids"] == rec["prompt_ids"]


def test_overlong_ignores_max_tokens(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    rec = by_id["mtbench-0-greedy"]
    content, n_in, n_out = (
        rec["api_view"]["content"],
        len(rec["prompt_ids"]),
        len(rec["output_ids"]),
    )
    with server(faults="overlong=1") as c:
        for extra, repeats in (
            ({}, 4),
            ({"max_tokens": 8}, 4),
            ({"max_tokens": 10 * n_out}, 21),
            ({"max_completion_tokens": 10 * n_out}, 21),
        ):
            body = chat(c, rec["messages"], **extra).json()
            (choice,) = body["choices"]
            assert choice["message"]["content"] == content * repeats
            assert choice["finish_reason"] == "stop"
            assert body["usage"] == {
                "prompt_tokens": n_in,
                "completion_tokens": repeats * n_out,
                "total_tokens": n_in + repeats * n_out,
            }
            limit = next(iter(extra.values()), None)
            if limit is not None:
                assert body["usage"]["completion_tokens"] > 2 * limit


def test_huge_answer(server: Server, by_id: dict[str, dict[str, Any]]) -> None:
    rec = by_id["mtbench-0-greedy"]
    with server(faults="huge=1", token_ids=True) as c:
        r = chat(c, rec["messages"], return_token_ids=True)
        stats = c.get("/stats").json()
    assert r.status_code == 200 and r.headers["x-replay-fault"] == "huge"
    assert int(r.headers["content-length"]) == len(r.content) > 16 * 2**20
    body = r.json()
    (choice,) = body["choices"]
    text = choice["message"]["content"]
    assert 16 * 2**20 <= len(text.encode()) < 16 * 2**20 + 200
    sentence = "The replay server repeats this sentence to make a huge answer. "
    assert text == sentence * (len(text) // len(sentence))
    assert choice["finish_reason"] == "stop" and "token_ids" not in choice
    assert body["usage"]["completion_tokens"] == 12 * (len(text) // len(sentence))
    assert body["usage"]["prompt_tokens"] == len(rec["prompt_ids"])
    assert body["prompt_token_ids"] == rec["prompt_ids"]
    assert stats["faults"]["huge"] == 1


def test_new_fault_counts_match_what_clients_saw(server: Server, records: Records) -> None:
    new = ("cut", "slowbody", "401", "403", "badtools", "strmessage", "nousage", "overlong")
    spec = ",".join(f"{k}=0.09" for k in new) + ",huge=0.02"
    plan = [records[i % 60]["messages"] for i in range(120)]  # 60 records, two attempts each
    with server(faults=spec, seed=11, slow_seconds=0.04) as c:
        got = aio_chats(c, plan)
        stats = c.get("/stats").json()
    seen = Counter(r.headers.get("x-replay-fault") for r in got)
    assert set(seen) - {None} == {*new, "huge"}
    assert stats["requests"] == stats["attempts"] == len(plan)
    assert {k: v for k, v in stats["faults"].items() if v} == {
        k: v for k, v in seen.items() if k is not None
    }
    assert stats["by_status"] == {
        "200": len(plan) - seen["401"] - seen["403"],
        "401": seen["401"],
        "403": seen["403"],
    }
    for r in got:
        fault = r.headers.get("x-replay-fault")
        assert r.status == {"401": 401, "403": 403}.get(fault or "", 200)
        if fault == "cut":
            assert isinstance(r.error, aiohttp.ClientPayloadError)
        elif r.status == 200:
            body = r.json()
            assert ("usage" in body) == (fault != "nousage")
        else:
            assert "error" in r.json()
