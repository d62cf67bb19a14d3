"""Every file a user can hand over (issue 37): JSON and TOML nested 100,000 deep, in each reader,
is one line naming the file and the fix (exit 2), or a skipped line counted by its reason,
never a RecursionError (exit 70). Each case failed before the change it guards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GROUNDTRUTH
from servers import manifest
from shared import SMOLLM2, UNIQUE, one_line_exit_2, run, write_prompts

#: a JSON array nested 100,000 levels deep: ``json.loads`` raises RecursionError on it
DEEP = "[" * 100_000 + "]" * 100_000
#: the longest line a reader takes, in bytes (``draftdata.lines.MAX_LINE_BYTES``; a test checks
#: they agree): written here so that each test fails on a draftdata without the cap
CAP = 32 << 20
GT_LINES = GROUNDTRUTH.read_text().splitlines(keepends=True)


def no_crash(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-2000:]
    assert r.returncode != 70, r.stderr


def with_deep_line(path: Path, n: int = 3) -> Path:
    """``n`` ground-truth lines, then a line nested 100,000 deep, then one more good line."""
    path.write_text("".join(GT_LINES[:n]) + '{"messages": ' + DEEP + "}\n" + GT_LINES[n])
    return path


# --- a line nested too deep is skipped and counted ---------------------------------------------
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_reconstruct_skips_and_counts_a_deep_line(jobs, tmp_path):
    out = tmp_path / "out.jsonl"
    src = with_deep_line(tmp_path / "in.jsonl")
    r = run("reconstruct", str(src), "-t", SMOLLM2, "-f", "chatml", "-o", str(out), "-j", jobs)
    no_crash(r)
    assert r.returncode == 0, r.stderr
    assert "too_deep: 1" in r.stderr
    assert len(out.read_text().splitlines()) == 4


def test_reconstruct_of_a_deep_array_line_is_counted(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(DEEP + "\n")
    out = tmp_path / "out.jsonl"
    r = run("reconstruct", str(src), "-t", SMOLLM2, "-f", "chatml", "-o", str(out))
    no_crash(r)
    assert "too_deep: 1" in r.stderr


def test_a_deep_prompt_line_is_counted_and_the_rest_read(tmp_path):
    from collections import Counter

    from draftdata.sources import iter_json_records

    src = with_deep_line(tmp_path / "p.jsonl")
    counter: Counter[str] = Counter()
    assert len(list(iter_json_records(src, counter))) == 4
    assert counter == Counter(too_deep=1)


def test_a_prompt_file_of_one_deep_line_is_one_line(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text('{"messages": ' + DEEP + "}\n")
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    line = one_line_exit_2(run("generate", str(m), "--quiet"))
    assert "gave no prompts" in line and "too_deep" in line


@pytest.mark.parametrize("cmd", ["validate", "learn", "contamination"])
def test_a_deep_json_array_file_is_one_line(cmd, tmp_path):
    """A file that opens with ``[`` is read as one JSON array (every reader of
    ``iter_json_records``)."""
    bad = tmp_path / "gt.json"
    bad.write_text(DEEP)
    if cmd == "contamination":
        src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
        m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
        args = ["contamination", str(m), "--against", str(bad)]
    else:
        args = {
            "validate": ["validate", str(bad)],
            "learn": ["learn", str(bad), "-o", str(tmp_path / "prefs.json")],
        }[cmd] + ["-t", SMOLLM2, "-f", "chatml"]
    line = one_line_exit_2(run(*args))
    assert str(bad) in line and "nested deeper" in line


@pytest.mark.parametrize("only", [False, True])
def test_audit_data_with_a_deep_line_skips_and_counts_it(only, tmp_path):
    """``audit --data`` reads JSONL a line at a time: a deep line, even the only one, is
    skipped and counted."""
    data = with_deep_line(tmp_path / "g.jsonl")
    if only:
        data.write_text(DEEP + "\n")
    r = run("audit", "-t", SMOLLM2, "-f", "chatml", "--data", str(data))
    no_crash(r)
    assert r.returncode in (0, 1), r.stderr
    assert "'too_deep': 1" in r.stdout + r.stderr


def test_validate_with_a_deep_line_skips_and_counts_it(tmp_path):
    r = run("validate", str(with_deep_line(tmp_path / "g.jsonl")), "-t", SMOLLM2, "-f", "chatml")
    no_crash(r)
    assert r.returncode in (0, 1), r.stderr
    assert "too_deep: 1" in r.stdout + r.stderr


def test_replay_server_counts_a_deep_line(tmp_path):
    from draftdata.devtools.replay_records import load_records

    records, skipped = load_records(with_deep_line(tmp_path / "gt.jsonl"))
    assert len(records) == 4 and skipped == {"too_deep": 1}
    cmd = [sys.executable, "-m", "draftdata", "replay-server", str(tmp_path / "gt.jsonl")]
    r = subprocess.run([*cmd, "--port", "99999"], capture_output=True, text=True, timeout=120)
    assert "--port" in one_line_exit_2(r)  # the records loaded; the port is what is refused


# --- a whole file nested too deep is one line ---------------------------------------------------
def test_a_deep_manifest_is_one_line(tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    m.write_text("a = " + DEEP + "\n" + m.read_text())
    for cmd in ("plan", "generate", "status"):
        line = one_line_exit_2(run(cmd, str(m)))
        assert str(m) in line and "nested deeper" in line


def test_a_manifest_with_a_key_of_20000_dotted_parts_is_one_line(tmp_path):
    """tomllib takes memory quadratic in a dotted key's parts (1.6 GB for this one)."""
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    m.write_text("a" + ".a" * 20_000 + " = 1\n" + m.read_text())
    peak = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True,"
        " text=True); sys.stderr.write(r.stderr); print(r.returncode,"
        " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cmd = [sys.executable, "-c", peak, sys.executable, "-m", "draftdata", "plan", str(m)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rc, kb = map(int, r.stdout.split())
    line = one_line_exit_2(subprocess.CompletedProcess(cmd, rc, "", r.stderr))
    assert str(m) in line and "nested deeper" in line
    assert kb < 400_000  # before: 1.6 GB, for a key it then called unknown


def test_a_deep_format_file_is_one_line(tmp_path):
    bad = tmp_path / "format.toml"
    bad.write_text('name = "x"\nversion = "1"\nend_of_turn = "<|im_end|>"\nx = ' + DEEP + "\n")
    line = one_line_exit_2(run("audit", "-t", SMOLLM2, "-f", str(bad)))
    assert str(bad) in line and "nested deeper" in line


def test_deep_prefs_are_one_line(tmp_path):
    prefs = tmp_path / "prefs.json"
    prefs.write_text(DEEP)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(GT_LINES[:2]))
    out = tmp_path / "out.jsonl"
    r = run("reconstruct", str(src), "-t", SMOLLM2, "-f", "chatml", "-o", str(out), "--prefs",
            str(prefs))  # fmt: skip
    line = one_line_exit_2(r)
    assert str(prefs) in line and "nested deeper" in line


def test_a_deep_tokenizer_json_is_one_line(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": ' + DEEP + "}")
    line = one_line_exit_2(run("audit", "-t", str(folder), "-f", "chatml"))
    assert "tokenizer.json" in line and "nested deeper" in line


def test_nesting_helpers_bound_depth():
    from draftdata.nesting import MAX_DEPTH, TooDeep, loads_json, loads_toml

    assert loads_json('{"a": [[1], {"b": 2}]}') == {"a": [[1], {"b": 2}]}
    assert loads_json("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    for depth in (MAX_DEPTH + 1, 900, 100_000):  # parsed by json, or too deep for it
        with pytest.raises(TooDeep):
            loads_json("[" * depth + "]" * depth)
    assert loads_json(json.dumps({"t": "[" * 1000})) == {"t": "[" * 1000}  # brackets in text
    with pytest.raises(TooDeep):
        loads_toml("a = " + DEEP)
    assert loads_toml("a = [[1]]") == {"a": [[1]]}
    for dotted in ("a" + ".a" * MAX_DEPTH + " = 1", "[" + "t." * MAX_DEPTH + "t]"):
        with pytest.raises(TooDeep):
            loads_toml(dotted)
    prose = 'system = "' + "One sentence. Another one here. " * 500 + '"'
    assert loads_toml("a.b.c = 1\n" + prose)["a"] == {"b": {"c": 1}}


# --- a NUL byte in a path of the manifest -------------------------------------------------------
@pytest.mark.parametrize("key", ["output", "source", "tokenizer"])
def test_a_nul_byte_in_a_manifest_path_is_one_line(key, tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", UNIQUE[:2])
    m = manifest(tmp_path, "http://127.0.0.1:9/v1", src, limit=2)
    text = m.read_text()
    start = text.index(f"\n{key} = ") + len(f"\n{key} = ") + 1
    m.write_text(text[:start] + "\\u0000" + text[start:])  # a TOML escape: the string holds NUL
    for cmd in ("plan", "generate", "status"):
        line = one_line_exit_2(run(cmd, str(m)))
        assert str(m) in line and key in line and "NUL" in line
    assert not (tmp_path / "run").exists()


# --- a line past the cap is skipped while it is read, and counted by its number -----------------
def with_long_line(path: Path, n: int = 3) -> Path:
    """``n`` ground-truth lines, then one line a little over the cap (no newline in it), then
    one more good line."""
    with path.open("wb") as f:
        f.write("".join(GT_LINES[:n]).encode())
        f.write(b'{"messages": "' + b"x" * (CAP + 1000) + b'"}\n')
        f.write(GT_LINES[n].encode())
    return path


def test_capped_lines_skip_a_long_line_and_keep_the_numbers(tmp_path):
    import io

    from draftdata.lines import MAX_LINE_BYTES, capped_lines

    assert MAX_LINE_BYTES == CAP

    data = b"a\n" + b"b" * 50 + b"\n" + b"c" * 10 + b"\nd" + b"e" * 100
    counter: dict[str, int] = {}
    got = list(capped_lines(io.BytesIO(data), counter, cap=10))
    assert got == [b"a\n", b"", b"c" * 10 + b"\n", b""]
    assert counter == {"line_too_long:2": 1, "line_too_long:4": 1}
    got = list(capped_lines(io.BytesIO(b"}\nxy\n"), counter, first=b"{", cap=10))
    assert got == [b"{}\n", b"xy\n"]
    got = list(capped_lines(io.BytesIO(b"z\n"), counter, first=b"{}\nxy\n\nz", cap=10))
    assert got == [b"{}\n", b"xy\n", b"\n", b"zz\n"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_reconstruct_skips_a_line_past_the_cap(jobs, tmp_path):
    out = tmp_path / "out.jsonl"
    src = with_long_line(tmp_path / "in.jsonl")
    r = run("reconstruct", str(src), "-t", SMOLLM2, "-f", "chatml", "-o", str(out), "-j", jobs)
    no_crash(r)
    assert r.returncode == 0, r.stderr
    assert "line_too_long:4: 1" in r.stderr
    assert len(out.read_text().splitlines()) == 4


def test_a_prompt_line_past_the_cap_is_skipped_and_counted(tmp_path):
    from collections import Counter

    from draftdata.sources import iter_json_records

    counter: Counter[str] = Counter()
    records = list(iter_json_records(with_long_line(tmp_path / "p.jsonl"), counter))
    assert len(records) == 4 and counter == Counter({"line_too_long:4": 1})


def test_the_replay_server_skips_a_line_past_the_cap(tmp_path):
    from draftdata.devtools.replay_records import load_records

    records, skipped = load_records(with_long_line(tmp_path / "gt.jsonl"))
    assert len(records) == 4 and skipped == {"line_too_long:4": 1}


def test_a_json_array_file_past_the_cap_is_one_line(tmp_path):
    big = tmp_path / "gt.json"
    big.write_bytes(b'[{"messages": "' + b"x" * (CAP + 10) + b'"}]')
    line = one_line_exit_2(run("validate", str(big), "-t", SMOLLM2, "-f", "chatml"))
    assert str(big) in line and "JSONL" in line


@pytest.mark.parametrize("bad", ["deep", "long", "not_an_object"])
def test_a_sample_file_with_a_bad_line_is_one_line(bad, tmp_path):
    """Sample files (``reconstruct -o`` output, read by contamination, score and
    hidden-states) hold only samples: a line nested too deep or past the cap is refused with
    its line number."""
    samples = tmp_path / "samples.jsonl"
    src = tmp_path / "in.jsonl"
    src.write_text("".join(GT_LINES[:4]))
    r = run("reconstruct", str(src), "-t", SMOLLM2, "-f", "chatml", "-o", str(samples))
    assert r.returncode == 0, r.stderr
    line = {"deep": DEEP, "long": '"' + "x" * (CAP + 10) + '"', "not_an_object": '"x"'}[bad]
    with samples.open("a") as f:
        f.write(line + "\n")
    args = ["contamination", str(samples), "--against", "mt-bench", "-t", SMOLLM2]
    got = one_line_exit_2(run(*args))
    where = f"{samples}: row 4" if bad == "not_an_object" else f"{samples}:5"
    said = {"deep": "nested deeper", "long": "MiB", "not_an_object": "not a sample"}[bad]
    assert where in got and said in got
