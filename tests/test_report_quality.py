"""Issue 29 in the report: the quality table near the top of the page (a count per dataset and
check, with the first examples of each and the end of their answers), the contamination block
(prompts checked, flagged by set, the first matches) and the summary's lines for both, over a
real run: the replay server answers the prompts of ``test_quality_wiring`` (whose answers fire
each check) and MT-Bench questions that ``[run] decontaminate`` drops when they are read.

What each figure should be is known from what was served, not from the code under test."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import PROMPTS
from draftdata.report import build_report, summary
from draftdata.tokens.quality import QUALITY_CHECKS
from servers import manifest, replay_server
from shared import CUT, FRENCH, LOOP, PASSED, SERVED, export_only, run, served, with_run

#: MT-Bench questions put among the prompts: each is dropped as contaminated when read
MT = [json.loads(x) for x in (PROMPTS / "mt_bench_question.jsonl").read_text().splitlines()][:3]

#: check -> the prompt ids whose served answer fires it (from ``SERVED``: a sentence repeated to
#: max_tokens loops and is cut; the photosynthesis answer is cut; one of the two prompts given
#: the same answer is a duplicate; the French answer to an English prompt is a mismatch)
FIRES = {
    "repetition_loop": {"loop"},
    "truncated": {"loop", "cut"},
    "empty_answer": set(),
    "think_unclosed": set(),
    "near_duplicate_answer": {"dup-a", "dup-b"},  # one of the two: the one read second
    "language_mismatch": {"french"},
    "count_mismatch": set(),  # the replay server counts the ids its answers were made from
}
COUNTS = {c: (1 if c == "near_duplicate_answer" else len(p)) for c, p in FIRES.items()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("quality")
    src, rec = served(tmp)
    mt = [
        {"id": f"mt-{r['question_id']}", "messages": [{"role": "user", "content": r["turns"][0]}]}
        for r in MT
    ]
    with src.open("a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in mt))
    with replay_server(rec) as url:
        m = manifest(tmp, url, src, limit=len(SERVED) + len(MT), turns="first")
        with_run(m, 'decontaminate = ["mt-bench"]')
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
    r = run("export", str(tmp / "run"))
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp / "run"


def shard_ids(run_dir: Path) -> dict[str, str]:
    """prompt id (the served one) -> the sample's id in the shards."""
    out = {}
    for f in sorted((run_dir / "export").glob("shard-*.parquet")):
        t = pq.read_table(f, columns=["id", "metadata"]).to_pylist()
        out.update({json.loads(r["metadata"])["id"]: r["id"] for r in t})
    return out


def section(page: str, start: str, end: str) -> str:
    return page[page.index(start) : page.index(end, page.index(start))]


def test_the_quality_table_counts_each_check_and_shows_examples(run_dir: Path) -> None:
    page = build_report(run_dir).read_text()
    ids = shard_ids(run_dir)
    assert set(ids) == set(SERVED)  # the MT-Bench prompts were never asked
    # the table comes right after the header, before the long sections
    assert page.index("id=quality>") < page.index("id=datasets>") < page.index("id=samples>")
    table = section(page, '<table class="quality">', "</table>")
    heads = re.findall(r'<th class=n title="([^"]*)">([^<]*)</th>', table)
    assert [(html.unescape(d), n) for d, n in heads] == [(d, n) for n, d in QUALITY_CHECKS]
    cells = re.findall(r"<td class=n>([^<]*)</td>", table)
    n = len(SERVED)
    assert cells[0] == str(n)
    want = [f"{COUNTS[c]} ({COUNTS[c] / n:.1%})" if COUNTS[c] else "0" for c, _ in QUALITY_CHECKS]
    assert cells[1:] == want
    # examples: each check with hits, its samples by id, with the end of the answer
    ex = section(page, "<h3>Examples</h3>", "</table>")
    rows = re.findall(r"<tr><td>.*?</td><td>([a-z_]+)</td><td>([^<]*)</td><td><pre>(.*?)</pre>", ex)
    by_check: dict[str, set[str]] = {}
    for check, sid, _ in rows:
        by_check.setdefault(check, set()).add(sid)
    assert set(by_check) == {c for c, k in COUNTS.items() if k}
    for check, sids in by_check.items():
        assert sids <= {ids[p] for p in FIRES[check]} and len(sids) == COUNTS[check]
    tails = {sid: text for _, sid, text in rows}
    for pid, answer in (("loop", LOOP), ("cut", CUT), ("french", FRENCH)):
        text = html.unescape(tails[ids[pid]])
        assert text.startswith("…") and answer[-40:] in text
        assert len(text) <= 81


def test_heavy_truncation_is_an_amber_quality_note_not_a_red_headline(tmp_path: Path) -> None:
    """3 of 4 answers cut at the run's own max_tokens: a note beside the quality table, not a
    red warning at the top (a cut answer is a quality fact, not a data-correctness failure)."""
    run_dir = export_only(tmp_path, ["length", "length", "length", "stop"], PASSED)
    page = build_report(run_dir).read_text()
    line = "d: 3 of 4 samples (75%) were cut off at max_tokens"
    assert '<div class="alerts">' not in page
    notes = section(page, "id=quality>", "id=contamination>")
    assert '<div class="notes"><strong>Notes</strong>' in notes and line in notes
    text = summary(run_dir)
    assert "warning:" not in text and f"note: {line}" in text
    assert text.index("note: d: 3 of 4") > text.index("\nquality ")


def test_the_contamination_block_lists_checked_flagged_and_first_matches(run_dir: Path) -> None:
    page = build_report(run_dir).read_text()
    block = section(page, "id=contamination>", "</section>" if "</section>" in page else "<h2")
    n = len(SERVED) + len(MT)
    assert re.search(rf"gt</span></td><td class=n>{n}</td><td class=n>{len(MT)}</td>", block)
    assert f"mt-bench {len(MT)}" in block
    for r in MT:
        assert re.search(
            # the prompt id is the ledger's stable id (the prompt was never stored)
            rf"<td>[0-9a-f]{{8,}}</td><td>mt-bench</td><td[^>]*>{r['question_id']}\.1</td>"
            r"<td[^>]*>1\.00</td>",
            block,
        ), r["question_id"]


def test_the_summary_has_the_quality_table_examples_and_contamination(run_dir: Path) -> None:
    text = summary(run_dir)
    ids = shard_ids(run_dir)
    lines = text.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("quality"))
    assert lines[head].split() == ["quality", "samples", *(n for n, _ in QUALITY_CHECKS)]
    n = len(SERVED)
    want = [
        f"{COUNTS[c]} ({COUNTS[c] / n:.1%})".split() if COUNTS[c] else ["0"]
        for c, _ in QUALITY_CHECKS
    ]
    assert lines[head + 1].split() == ["gt", str(n), *(w for ws in want for w in ws)]
    for check, pids in FIRES.items():
        shown = [x for x in lines if x.startswith(f"  gt {check} ")]
        assert len(shown) == COUNTS[check]
        assert all(any(f" {ids[p]}: " in x for p in pids) for x in shown)
    assert f"  gt: {len(MT)} of {n + len(MT)} prompts flagged (mt-bench {len(MT)})" in lines
    for r in MT:
        pattern = rf"    [0-9a-f]{{8,}} ~ mt-bench {r['question_id']}\.1 \(score 1\.00, ngram\)"
        assert any(re.fullmatch(pattern, x) for x in lines), r["question_id"]


def test_a_run_without_decontaminate_says_not_checked(run_dir: Path, tmp_path: Path) -> None:
    import shutil
    import sqlite3

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    db = sqlite3.connect(copy / "ledger.sqlite")
    doc = json.loads(db.execute("SELECT value FROM meta WHERE key='manifest'").fetchone()[0])
    doc["run"]["decontaminate"] = []
    db.execute("UPDATE meta SET value=? WHERE key='manifest'", (json.dumps(doc),))
    db.execute("DELETE FROM meta WHERE key LIKE 'contamination:%'")
    db.commit()
    db.close()
    page = build_report(copy).read_text()
    assert "Not checked: the run had no <code>[run] decontaminate</code>" in page
    assert "contamination: not checked (no [run] decontaminate)" in summary(copy)


def test_examples_stop_at_three_and_show_ids_without_the_tokenizer(tmp_path: Path) -> None:
    """5 cut answers, the manifest's tokenizer file not at hand: 3 examples, each its last ids,
    and a note that says why there is no text."""
    run_dir = export_only(tmp_path, ["length"] * 5, PASSED)
    shard = run_dir / "export" / "shard-00000.parquet"
    t = pq.read_table(shard)
    t = t.set_column(
        t.schema.get_field_index("warnings"),
        t.schema.field("warnings"),
        pa.array([["truncated"]] * 5, type=t.schema.field("warnings").type),
    )
    pq.write_table(t, shard)
    page = build_report(run_dir).read_text()
    ex = section(page, "<h3>Examples</h3>", "</table>")
    # export_only's samples are ids 0..11 with an 8-id prompt: the answer is 8 9 10 11
    assert re.findall(r"<td>(d/\d)</td><td><pre>ids …8 9 10 11</pre>", ex) == ["d/0", "d/1", "d/2"]
    assert "the export&#x27;s tokenizer (t) is not at hand" in page
    assert "5 (100.0%)" in section(page, '<table class="quality">', "</table>")
