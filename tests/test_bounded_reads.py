"""What the report, the tokens stage and the hidden-state capture hold while they read a run:
bounded by one row group, one window of answer text, and what the quality checks read."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

from conftest import GROUNDTRUTH
from draftdata.records import Answered, Key, Prompt, StoredResponse
from draftdata.sources import read_ground_truth

#: reads a Parquet file back the way ``how`` says, in a process of its own; prints the Arrow
#: pool's high-water mark in MB and how many rows were read
_READ = """
import sys
import pyarrow as pa, pyarrow.parquet as pq
from draftdata.files import parquet_batches
path, how = sys.argv[1], sys.argv[2]
pool = pa.default_memory_pool()
base = pool.max_memory()
pf = pq.ParquetFile(path)
it = (parquet_batches(pf, batch_size=64, columns=["input_ids"]) if how == "ours"
      else pf.iter_batches(batch_size=64, columns=["input_ids"]))
n = sum(b.num_rows for b in it)
print((pool.max_memory() - base) / 2**20, n)
"""


def test_a_parquet_file_is_read_a_row_group_at_a_time(tmp_path):
    """Every row, and Arrow memory for about one row group (2 MB of ids here), where the whole
    file's iterator reads ahead (4x one row group in the 2k rehearsal's report)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "ids.parquet"
    ids = pa.array([np.arange(4096, dtype=np.int32) for _ in range(128)], pa.list_(pa.int32()))
    with pq.ParquetWriter(path, pa.schema([("input_ids", pa.list_(pa.int32()))])) as w:
        for _ in range(16):  # 16 row groups of 2 MB of ids
            w.write_table(pa.table({"input_ids": ids}))
    got = {}
    for how in ("ours", "whole"):
        r = subprocess.run(
            [sys.executable, "-c", _READ, str(path), how],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        mb, n = r.stdout.split()
        assert int(n) == 16 * 128
        got[how] = float(mb)
    print(got)
    assert got["ours"] < 4 * 2.0, got  # decoded ids, their levels, the compressed pages
    assert got["ours"] < got["whole"], got


def _answers() -> list[Answered]:
    out = []
    for g in read_ground_truth(GROUNDTRUTH, Counter()):
        if g.view is None or not g.view.content:
            continue
        k = Key(g.source, g.id, 0, 0)
        body = {"choices": [{"message": {"content": g.view.content}}], "id": g.id}
        stored = StoredResponse(k, "truth", body, g.output_ids, g.prompt_ids, g.finish_reason, 0.0)
        out.append(
            Answered(k, Prompt(g.id, g.source, g.messages, g.tools), g.messages, stored, g.view)
        )
    return out


def test_the_quality_checks_read_the_same_of_a_slim_answer():
    """The tokens stage keeps each answer out to its workers as ``for_checks`` makes it (no
    parsed body, no ids): the cross-answer checks fire the same on it, answer by answer."""
    from draftdata.tokens.checks import RunChecks, for_checks

    answers = _answers()
    answers += [a for a in answers[:40]]  # repeats: near_duplicate_answer fires
    full = RunChecks(loader=_fake_language)
    slim = RunChecks(loader=_fake_language)
    fired = [full.across(a) for a in answers]
    assert fired == [slim.across(for_checks(a)) for a in answers]
    assert any("near_duplicate_answer" in f for f in fired)
    s = for_checks(answers[0])
    assert s.stored.response == {} and s.stored.output_ids is None and s.view.reasoning is None


def _fake_language():
    """A stand-in detector with a verdict that depends on the text (the check's wiring is what
    is compared here, not py3langid)."""
    return lambda text: "en" if text.isascii() else "xx"


def test_windows_close_at_a_count_or_at_their_characters():
    from draftdata.tokens.sample_maker import WINDOW_CHARS, windows

    answers = _answers()
    assert [len(w) for w in windows(answers, 7)][:3] == [7, 7, 7]
    big = [a for a in answers if len(a.view.content or "") > 500]
    per = WINDOW_CHARS // 500
    got = list(windows(big * (2 * per // len(big) + 2), most=10**9))
    assert len(got) >= 2 and sum(map(len, got)) == len(big) * (2 * per // len(big) + 2)
    for w in got[:-1]:
        chars = sum(len(a.view.content or "") + len(a.view.reasoning or "") for a in w)
        last = len(w[-1].view.content or "") + len(w[-1].view.reasoning or "")
        assert WINDOW_CHARS <= chars < WINDOW_CHARS + last
    assert json.dumps([a.key.sample_id for w in got for a in w])  # order and keys kept
