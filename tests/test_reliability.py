"""Nothing lost, nothing paid twice, no record that blocks a run: each case against the project's
replay server on loopback, and each failing before the change it guards."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from conftest import GROUNDTRUTH
from draftdata.store import codec
from servers import manifest, peak_generate, replay_server, stats
from shared import OUR_PROMPT_IDS, UNIQUE, run, write_prompts


def ledger_counts(run_dir: Path) -> tuple[int, int]:
    """(responses stored, successful attempts) straight from the ledger file."""
    import sqlite3

    db = sqlite3.connect(run_dir / "ledger.sqlite")
    try:
        (n,) = db.execute("SELECT count(*) FROM responses").fetchone()
        (ok,) = db.execute("SELECT count(*) FROM attempts WHERE ok=1").fetchone()
    finally:
        db.close()
    return n, ok


def test_two_writers_on_one_run_folder_one_refuses_nothing_paid_twice(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:150])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=150, turns="first")
        cmd = [sys.executable, "-m", "draftdata", "generate", str(m), "--quiet"]
        procs = [
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=900) for p in procs]
        served = stats(url)["requests"]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    refused = next(err for (_, err), p in zip(outs, procs, strict=True) if p.returncode == 2)
    assert "is in use by pid" in refused and "Traceback" not in refused
    stored, ok = ledger_counts(tmp_path / "run")
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    assert st["attempts"] == served  # every request the server saw is in the ledger, once
    assert stored == ok == st["done"] and st["duplicates"] == 0  # one answer per key


def test_a_prompt_that_does_not_render_is_quarantined_and_reruns_go_on(tmp_path):
    """A record the reader accepts but the format cannot render (tool schemas for a chatml
    target) is quarantined with its reason; the others are answered, and a rerun does not
    crash on it."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    bad_content = {"messages": [{"role": "user", "content": 42}]}  # skipped by the reader
    recs = UNIQUE[:20]
    src = write_prompts(tmp_path / "p.jsonl", recs, {3: {"tools": tools}})
    with src.open("a") as f:
        f.write(json.dumps(bad_content) + "\n")
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=100, turns="first")
        for _ in range(2):
            r = run("generate", str(m), "--quiet")
            assert r.returncode == 0, r.stderr
            assert "Traceback" not in r.stderr
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    assert (st["total"], st["done"], st["quarantined"]) == (20, 19, 1)
    assert st["samples"] == 19
    bad = json.loads(run("status", str(m), "--failed", "--json").stdout)
    assert len(bad) == 1 and bad[0]["state"] == "quarantined"
    assert bad[0]["reason"].startswith("unrenderable_prompt: FormatError")


def _load_export(run_dir: Path) -> int:
    """The export as a trainer reads it: manifest.json, every shard it lists, whole."""
    from draftdata.tokenizers.base import file_sha256

    export = run_dir / "export"
    doc = json.loads((export / "manifest.json").read_text())
    rows = 0
    for s in doc["shards"]:
        path = export / s["path"]
        assert file_sha256(path) == s["sha256"]
        rows += pq.read_table(path).num_rows
    assert rows == doc["counts"]["samples"]
    return rows


def test_kill_9_during_export_leaves_the_previous_export_whole(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:120])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=120, turns="first")
        assert run("generate", str(m), "--quiet").returncode == 0
    run_dir = tmp_path / "run"
    assert run("export", str(run_dir)).returncode == 0
    rows = _load_export(run_dir)
    assert rows > 100
    rng = random.Random(7)
    # the Parquet export: `--as speculators` spends most of its time importing torch, where a
    # kill tests nothing
    cmd = [sys.executable, "-m", "draftdata", "export", str(run_dir)]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    whole = time.monotonic() - t0  # one export on this machine, now: kills land inside it
    killed = 0
    for _ in range(5):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.15, 0.95) * whole)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
        assert _load_export(run_dir) == rows  # whatever the moment, an export loads whole
    assert killed >= 3
    assert run("export", str(run_dir)).returncode == 0
    assert _load_export(run_dir) == rows
    assert len(list(run_dir.glob(".export-*"))) == 1  # staged leftovers are cleaned up


def test_a_changed_manifest_is_refused_and_extend_asks_only_for_new_prompts(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:30])
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=10, turns="first")
        assert run("generate", str(m), "--quiet").returncode == 0
        first = stats(url)["requests"]
        text = m.read_text()
        # another max_tokens would stamp new settings on the old answers: refused
        m.write_text(text.replace("max_tokens = 256", "max_tokens = 64"))
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 2, r.stderr
        assert "sampling.max_tokens 256 -> 64" in r.stderr and "new [run] output" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        # a larger limit: refused without --extend, then only the new prompts are asked for
        m.write_text(text.replace("limit = 10", "limit = 25"))
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 2 and "limit 10 -> 25" in r.stderr and "--extend" in r.stderr
        r = run("generate", str(m), "--quiet", "--extend")
        assert r.returncode == 0, r.stderr
        assert stats(url)["requests"] - first == 15
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    assert (st["total"], st["done"], st["duplicates"]) == (25, 25, 0)


def test_an_empty_ledger_is_refused_not_taken_for_a_new_run(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:5])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ledger.sqlite").write_bytes(b"")
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=5, turns="first")
    r = run("generate", str(m), "--quiet")
    assert r.returncode == 2
    assert "the ledger file is empty" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "run" / "ledger.sqlite").stat().st_size == 0  # not replaced


def test_credentials_in_base_url_are_redacted_everywhere_stored(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:4])
    with replay_server(GROUNDTRUTH) as url:
        secret_url = url.replace("http://", "http://alice:s3cret-pass@")
        m = manifest(tmp_path, secret_url, src, limit=4, turns="first")
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
    raw = b"".join(p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file())
    assert b"s3cret-pass" not in raw and b"alice" not in raw
    import sqlite3

    # and not inside the compressed bodies either
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    bodies = [
        codec.unpack_text(b) or ""
        for row in db.execute("SELECT request, response FROM attempts")
        for b in row
    ]
    db.close()
    assert len(bodies) >= 8 and all(b for b in bodies)
    assert not any("s3cret-pass" in b or "alice" in b for b in bodies)
    assert "s3cret-pass" not in r.stdout + r.stderr


#: run inside a mount namespace of its own: ``$1`` becomes a 1 MiB tmpfs, the arguments after
#: ``$2`` run as a command, and the tmpfs (gone when the namespace ends) is copied to ``$2``;
#: exit 97 where the tmpfs cannot be mounted, 98 where the copy fails
ON_SMALL_DISK = """
mount -t tmpfs -o size=1m tmpfs "$1" || exit 97
small=$1 copy=$2
shift 2
"$@"
rc=$?
cp -a "$small" "$copy" || exit 98
exit $rc
"""


def on_small_disk(small: Path, copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``args`` with ``small`` a 1 MiB tmpfs that fills: a real ENOSPC, not a simulated one.
    The tmpfs is mounted in a user and mount namespace of its own (``unshare``, util-linux), so
    no root is needed and nothing outside the namespace sees it; its files are copied to
    ``copy`` before the namespace ends. A machine that cannot make one fails, naming why."""
    unshare = shutil.which("unshare")
    assert unshare, "the full-disk test needs util-linux's `unshare` to mount a tmpfs"
    namespace = [unshare, "--user", "--map-root-user", "--mount"]
    r = subprocess.run(
        [*namespace, "sh", "-c", ON_SMALL_DISK, "sh", str(small), str(copy), *args],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    why = "this kernel or container refuses user namespaces, or tmpfs mounts in them"
    assert r.returncode != 97 and not r.stderr.startswith("unshare:"), (
        f"could not mount a 1 MiB tmpfs in a namespace of its own ({why}): {r.stderr}"
    )
    assert r.returncode != 98, f"could not copy the full disk's files out: {r.stderr}"
    return r


def test_a_full_disk_stops_with_one_line_and_loses_nothing(tmp_path):
    """A run folder on a 1 MiB tmpfs that fills mid-run: one error line naming the full disk,
    every answer stored before it kept, and the same run resumed on a bigger disk."""
    small = tmp_path / "small"
    small.mkdir()
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:200])
    with replay_server(GROUNDTRUTH) as url:
        # the manifest is read inside the namespace, where the tmpfs hides `small`'s files
        m = manifest(small, url, src, limit=200, turns="first").rename(tmp_path / "small.toml")
        big = tmp_path / "big"  # the tmpfs's files, copied out before the namespace ends
        py = [sys.executable, "-m", "draftdata"]
        r = on_small_disk(small, big, *py, "generate", str(m), "--quiet")
        assert r.returncode in (1, 2), r.stderr
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
        assert len(errors) == 1 and "disk is full" in errors[0], r.stderr
        assert "Traceback" not in r.stderr
        stored_before, _ = ledger_counts(big / "run")
        assert 0 < stored_before < 200
        # free space by moving the run folder to a big disk, then resume there
        m2 = big / "manifest.toml"
        m2.write_text(m.read_text().replace(str(small), str(big)))
        r = run("generate", str(m2), "--quiet")
        assert r.returncode == 0, r.stderr
        stored_after, ok = ledger_counts(big / "run")
        assert stored_after >= stored_before and stored_after == ok


def test_poisoned_responses_and_a_poisoned_prompt_are_quarantined_among_200(tmp_path):
    """Answers whose message is a string or whose tool_calls is not a list are stored and
    quarantined with their reason; a prompt that cannot render is quarantined; the run goes on
    and a rerun does not crash."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:200], {7: {"tools": tools}})
    with replay_server(GROUNDTRUTH, "--faults", "strmessage=0.02,badtools=0.02") as url:
        m = manifest(tmp_path, url, src, limit=200, turns="first")
        for _ in range(2):
            r = run("generate", str(m), "--quiet")
            assert "Traceback" not in r.stderr, r.stderr
            assert r.returncode in (0, 1) and "error:" not in r.stderr, r.stderr
        served = stats(url)["faults"]
    poisoned = served.get("strmessage", 0) + served.get("badtools", 0)
    assert poisoned >= 2
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    quarantined_answers = sum(n for k, n in st["drops"].items() if k.startswith("quarantined:"))
    assert quarantined_answers == poisoned
    assert st["quarantined"] == 1  # the prompt
    assert st["samples"] + quarantined_answers == st["done"]
    stored, ok = ledger_counts(tmp_path / "run")
    assert stored == ok == st["done"]  # the poisoned answers were paid for: they are stored
    bad = json.loads(run("status", str(m), "--failed", "--json").stdout)
    reasons = [b["reason"] for b in bad]
    assert sum(r.startswith("quarantined:unusable_message") for r in reasons) == poisoned


def _server_cost(run_dir: Path, price_in: float, price_out: float) -> float:
    """What the answers cost by the server's own counts: its usage where it sent one, else the
    answer's length in the target's tokens."""
    import sqlite3

    from conftest import TOKENIZERS
    from draftdata.tokenizers import load_tokenizer

    tok = load_tokenizer(str(TOKENIZERS / "smollm2"))
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    total = 0.0
    for resp, our_prompt in db.execute(
        f"SELECT a.response, {OUR_PROMPT_IDS} FROM responses r JOIN attempts a ON a.id = "
        "r.attempt_id"
    ):
        data = json.loads(codec.unpack_text(resp))
        usage = data.get("usage") or {}
        msg = data["choices"][0]["message"]
        ct = usage.get("completion_tokens", len(tok.encode(msg.get("content") or "")))
        pt = usage.get("prompt_tokens", len(codec.unpack_ids(our_prompt)))
        total += (pt * price_in + ct * price_out) / 1e6
    db.close()
    return total


def test_the_budget_holds_against_a_server_that_omits_usage(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:60])
    cap = 0.05
    with replay_server(GROUNDTRUTH, "--faults", "nousage=0.5") as url:
        m = manifest(
            tmp_path,
            url,
            src,
            limit=60,
            turns="first",
            budget=f"budget_usd = {cap}",
            extra_backend="price_in_per_mtok = 2.0\nprice_out_per_mtok = 6.0",
        )
        r = run("generate", str(m), "--quiet")
        assert "budget reached" in r.stderr, r.stderr
    run_dir = tmp_path / "run"
    st = json.loads(run("status", str(m), "--json").stdout)
    assert 0 < st["cost_usd"] <= cap
    assert _server_cost(run_dir, 2.0, 6.0) <= cap


def test_a_capped_run_goes_one_at_a_time_only_until_its_first_answer(tmp_path):
    """With a budget the first request goes alone (what the server really charges is not known
    before it); once it is answered, the requests already waiting go out together, up to the
    backend's concurrency. They queued on the first request's lock and went one by one, each
    holding it through its whole answer: the 10k rehearsal of issue 40 had 64 requests in
    flight only 241 s into its run, and the same again after its resume."""
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:8])
    with replay_server(GROUNDTRUTH, "--faults", "slow=1.0", "--slow-seconds", "0.5") as url:
        m = manifest(
            tmp_path,
            url,
            src,
            limit=8,
            turns="first",
            budget="budget_usd = 10.0",
            extra_backend="price_in_per_mtok = 2.0\nprice_out_per_mtok = 6.0",
        )
        r = run("generate", str(m), "--quiet")
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    spans = [
        (a, a + t) for a, t in db.execute("SELECT started_at, latency_s FROM attempts WHERE ok=1")
    ]
    db.close()
    assert len(spans) == 8
    # the most answered requests in flight at once (concurrency 8: the first alone, then 7)
    most = max(sum(1 for a, b in spans if a <= start < b) for start, _ in spans)
    assert most >= 5, f"at most {most} requests were in flight at once"


def test_a_server_that_writes_past_max_tokens_is_stopped_at_its_first_answer(tmp_path):
    """An answer far past max_tokens means no reservation bounds what the server costs: the
    backend stops with one line, the answer is stored and quarantined as runaway. The replay
    server answers whole: it refuses the stream a capped run asks for first, and the run goes
    on with whole answers (the refusal is kept as an attempt of its own)."""
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:60])
    with replay_server(GROUNDTRUTH, "--faults", "overlong=1.0") as url:
        m = manifest(
            tmp_path,
            url,
            src,
            limit=60,
            turns="first",
            budget="budget_usd = 1.0",
            extra_backend="price_in_per_mtok = 2.0\nprice_out_per_mtok = 6.0",
        )
        r = run("generate", str(m), "--quiet")
        served = stats(url)["requests"]
    assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    assert served == 2  # the refused stream, then the first answer: each alone
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    reasons = [r for (r,) in db.execute("SELECT reason FROM attempts ORDER BY id")]
    db.close()
    assert reasons[0] == "stream_refused" and len(reasons) == 2, reasons
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    assert st["done"] == 1 and st["drops"] == {"quarantined:runaway": 1}, st


def test_broken_and_slow_bodies_are_retried_like_timeouts(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:40])
    with replay_server(
        GROUNDTRUTH, "--faults", "cut=0.25,slowbody=0.1", "--slow-seconds", "3"
    ) as url:
        m = manifest(tmp_path, url, src, limit=40, turns="first")
        m.write_text(m.read_text().replace("timeout_s = 10", "timeout_s = 2"))
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
        served = stats(url)["faults"]
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    assert st["failed"] == 0 and st["done"] == st["total"]
    errors = st["errors"]
    cut = sum(n for k, n in errors.items() if k.startswith("connection_error"))
    assert cut == served.get("cut", 0) > 0
    assert errors.get("timeout", 0) == served.get("slowbody", 0) > 0


def test_a_refused_key_stops_the_dataset_at_once(tmp_path, monkeypatch):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:200])
    with replay_server(GROUNDTRUTH, "--faults", "401=1.0") as url:
        m = manifest(
            tmp_path, url, src, limit=200, turns="first", extra_backend='api_key_env = "DD_KEY"'
        )
        r = subprocess.run(
            [sys.executable, "-m", "draftdata", "generate", str(m), "--quiet"],
            capture_output=True,
            text=True,
            env={**os.environ, "DD_KEY": "wrong"},
            timeout=600,
        )
        served = stats(url)["requests"]
    assert r.returncode == 1, r.stderr
    assert "refused the API key (HTTP 401); check the key in DD_KEY" in r.stderr
    assert served <= 16  # the requests already in flight, not 200 prompts x 8 retries


def test_empty_answers_are_retried_then_kept_with_their_reason(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:60])
    with replay_server(GROUNDTRUTH, "--faults", "empty=0.3") as url:
        m = manifest(tmp_path, url, src, limit=60, turns="first")
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
        served = stats(url)["faults"].get("empty", 0)
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    retried = st["errors"].get("empty_response", 0)
    kept = st["drops"].get("empty_response", 0)
    assert retried > 0 and retried + kept == served  # each empty answer: retried, or kept
    assert st["failed"] == 0 and st["samples"] + kept == st["done"] == st["total"]


def test_a_16_mib_answer_is_stored_quarantined_and_memory_stays_flat(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:3])
    with replay_server(GROUNDTRUTH, "--faults", "huge=1.0") as url:
        m = manifest(tmp_path, url, src, limit=3, turns="first")
        r, peak_kb = peak_generate(m)
    # far past max_tokens: the backend stops (the answers already in flight are stored)
    assert r.returncode == 1 and "ignores max_tokens" in r.stderr, r.stderr
    print(f"peak RSS of generate with a 16 MiB answer: {peak_kb / 1024:.0f} MB")
    assert peak_kb < 300 * 1024, f"peak RSS {peak_kb / 1024:.0f} MB"
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    assert st["drops"] == {"quarantined:oversized": st["done"]} and st["done"] >= 1
    import sqlite3

    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    longest = max(len(codec.unpack_text(b)) for (b,) in db.execute("SELECT response FROM attempts"))
    # the body is read up to max_answer_bytes (4 MiB) and kept as it came; the rest is not read
    assert longest == 4 * 1024 * 1024


def test_fixing_the_input_file_helps_answered_prompts_stay(tmp_path):
    """Prompts were frozen in the ledger: fixing a bad record in the source did not help. A
    changed source is read again; answered prompts keep their answers."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    recs = UNIQUE[:12]
    src = write_prompts(tmp_path / "p.jsonl", recs, {5: {"tools": tools}})
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=100, turns="first")
        assert run("generate", str(m), "--quiet").returncode == 0
        before = stats(url)["requests"]
        st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
        assert (st["done"], st["quarantined"]) == (11, 1)
        write_prompts(src, recs)  # the bad record fixed
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
        assert "1 new prompts, 1 unanswered prompts no longer in it, 11 answered prompts kept" in (
            r.stderr
        )
        assert stats(url)["requests"] - before == 1  # only the fixed prompt is asked for
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    assert (st["total"], st["done"], st["quarantined"], st["samples"]) == (12, 12, 0, 12)


def test_a_huge_prompt_is_skipped_with_its_reason(tmp_path):
    recs = UNIQUE[:3]
    src = write_prompts(tmp_path / "p.jsonl", recs)
    with src.open("a") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "word " * 4_000_000}]}))
        f.write("\n")
    with replay_server(GROUNDTRUTH) as url:
        m = manifest(tmp_path, url, src, limit=10, turns="first")
        r = run("plan", str(m), "--json")
        doc = json.loads(r.stdout)
        assert doc["datasets"][0]["read_drops"] == {"prompt_too_large": 1}
        assert doc["datasets"][0]["prompts"] == 3
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stderr
    st = json.loads(run("status", str(m), "--json").stdout)["datasets"]["gt"]
    assert st["total"] == 3
