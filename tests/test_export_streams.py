"""The export and every trainer writer as functions over a stream of samples: run here from a list
of `Sample`s made from ground-truth records (the real SmolLM2 tokenizer and ChatML format), with
no run manifest, run lock, ledger or Runner. What the files hold is read back with the readers a
trainer uses (Hugging Face `datasets`, speculators' and SpecForge's own loaders) and compared with
the ground truth's own ids (prompt_ids + output_ids), not with anything our writers computed."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import GROUNDTRUTH, TOKENIZERS
from draftdata import __version__
from draftdata.export.shards import read_samples, write_shards
from draftdata.export.trainers import EXPORTERS, LAYOUTS, TRAINERS
from draftdata.export.write import read_export_manifest, write_export
from draftdata.formats import get_format
from draftdata.records import Answered, GroundTruth, Key, Prompt, Sample, StoredResponse
from draftdata.records.export import ExportManifest, FormatPin, TokenizerPin
from draftdata.sources import read_ground_truth
from draftdata.tokenizers import load_tokenizer
from draftdata.tokens.target import Target

#: ground-truth records: four sources, tools (bfcl), answers that stopped and answers cut at
#: max_tokens
IDS = (
    "mtbench-0-greedy",
    "mtbench-2-greedy",
    "mtbench-0-sample",
    "sharegpt-0-greedy",
    "bfcl-0-greedy",
    "humaneval-0-greedy",
)


@pytest.fixture(scope="module")
def bound():
    return get_format("chatml").bind(load_tokenizer(str(TOKENIZERS / "smollm2")))


@pytest.fixture(scope="module")
def truth() -> list[GroundTruth]:
    by_id = {g.id: g for g in read_ground_truth(GROUNDTRUTH, Counter())}
    picked = [by_id[i] for i in IDS if i in by_id]
    assert len(picked) >= 5, "the ground truth file changed: pick records it holds"
    assert {g.finish_reason for g in picked} == {"stop", "length"}
    return picked


def key_of(g: GroundTruth) -> Key:
    return Key(g.source, g.id, 0, 0)


def expected(g: GroundTruth) -> list[int]:
    """The model's own ids for the record: what every export must hand a trainer."""
    assert g.prompt_ids is not None
    return [*g.prompt_ids, *g.output_ids]


@pytest.fixture(scope="module")
def samples(bound, truth) -> list[Sample]:
    out = []
    for g in truth:
        assert g.view is not None
        s = Target(bound).reconstruct(
            g.messages, g.view, tools=g.tools, record_id=g.id, dataset=g.source
        )
        assert s.input_ids == expected(g), f"{g.id}: the chosen records reconstruct exactly"
        k = key_of(g)
        out.append(replace(s, id=k.sample_id, key=k))
    return out


@pytest.fixture(scope="module")
def head(bound) -> ExportManifest:
    """The manifest's run-level facts, written by hand: no run manifest or ledger behind it."""
    tok, fmt = bound.tokenizer, bound.format
    return ExportManifest(
        run="streams",
        tokenizer=TokenizerPin(str(tok.path), tok.sha256, tok.chat_template_sha256),
        format=FormatPin(fmt.name, fmt.version),
        draftdata_version=__version__,
    )


def by_id(truth: list[GroundTruth]) -> dict[str, GroundTruth]:
    return {key_of(g).sample_id: g for g in truth}


def test_export_from_a_list_of_samples_loads_with_datasets(samples, truth, head, bound, tmp_path):
    import datasets

    folder = tmp_path / "export"
    # a one-shot iterator: the export reads the stream once
    got = write_export(iter(samples), folder, head, tokenizer=bound.tokenizer, shard_bytes=4096)
    assert len(got.shards) > 1  # split by size, every shard whole
    files = sorted(folder.glob("shard-*.parquet"))
    assert [s.path for s in got.shards] == [f.name for f in files]
    for s, f in zip(got.shards, files, strict=True):
        assert s.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
        assert s.bytes == f.stat().st_size
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left

    # the loader the manifest names
    ds = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    truth_by_id = by_id(truth)
    assert len(ds) == len(truth)
    for row in ds:
        g = truth_by_id[row["id"]]
        assert row["input_ids"] == expected(g)
        n = len(g.prompt_ids or ())
        assert row["loss_mask"] == [False] * n + [True] * len(g.output_ids)
        assert (row["dataset"], row["prompt_id"], row["finish_reason"]) == (
            g.source,
            g.id,
            g.finish_reason,
        )
        assert row["provenance"]["tokenizer_sha256"] == bound.tokenizer.sha256
        assert json.loads(row["metadata"]) == {}

    # manifest.json: the figures counted from the stream, against the ground truth's
    doc = json.loads((folder / "manifest.json").read_text())
    assert doc["counts"]["samples"] == len(truth)
    assert {k: d["samples"] for k, d in doc["datasets"].items()} == dict(
        Counter(g.source for g in truth)
    )
    finishes: Counter[str] = Counter()
    for d in doc["datasets"].values():
        finishes.update(d["finish_reasons"])
    assert finishes == Counter(g.finish_reason for g in truth)
    assert doc["format"] == {"name": "chatml", "version": bound.format.version}
    assert doc["tokenizer"]["sha256"] == bound.tokenizer.sha256
    assert [p["samples"] for p in doc["provenance"]] == [len(truth)]
    assert doc["loader"].startswith("datasets.load_dataset('parquet'")
    # one serialiser each way: the file reads back to the record, and writes back to the file
    assert read_export_manifest(folder) == got
    assert json.dumps(ExportManifest.from_json(doc).to_json()) == json.dumps(doc)
    preview = json.loads((folder / "preview.json").read_text())
    assert set(preview["datasets"]) == {g.source for g in truth}


def test_shards_from_a_list_read_back(samples, truth, tmp_path):
    shards = write_shards(
        samples, tmp_path / "shards", metadata=lambda s: {"prompt": s.key.prompt_id}
    )
    assert sum(s.rows or 0 for s in shards) == len(truth)
    _, back = read_samples(tmp_path / "shards")
    truth_by_id = by_id(truth)
    assert [s.input_ids for s in back] == [expected(truth_by_id[s.id]) for s in back]
    assert back == samples


def test_the_registry_spells_each_trainer_once():
    assert set(EXPORTERS) == {
        "speculators", "specforge", "specforge-conversations",
        "modelopt", "nemo-automodel", "nemo-automodel-conversations",
    }  # fmt: skip
    assert list(LAYOUTS) == [
        "speculators", "specforge", "modelopt", "nemo-automodel", "safetensors",
    ]  # fmt: skip
    assert "fp8" not in TRAINERS["modelopt"].dtypes  # ModelOpt reads no fp8 scale
    for name, e in EXPORTERS.items():
        owners = [t.name for t in TRAINERS.values() if e in t.exports]
        assert len(owners) == 1 and name.startswith(owners[0]), (name, owners)
        assert (e.write is None) != (e.write_conversations is None)
        assert (e.lossy is not None) == (e.write_conversations is not None)
    assert "fp8" not in TRAINERS["specforge"].dtypes


def test_speculators_writer_from_a_list_loads_with_speculators(samples, truth, head, tmp_path):
    import torch
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset
    from speculators.train.data import ArrowDataset

    paths = EXPORTERS["speculators"].write(iter(samples), head, tmp_path)  # type: ignore[misc]
    assert [p.name for p in paths] == ["speculators.jsonl", "speculators-dataset"]
    want = Counter(
        (tuple(expected(g)), tuple([0] * len(g.prompt_ids or ()) + [1] * len(g.output_ids)))
        for g in truth
    )
    ds, _ = load_and_preprocess_dataset(
        str(TOKENIZERS / "smollm2"), [str(paths[0])], seq_length=1 << 20, build_dataset_num_proc=1
    )
    got = Counter((tuple(r["input_ids"].tolist()), tuple(r["loss_mask"].tolist())) for r in ds)
    assert got == want
    arrow = ArrowDataset(
        max_len=4096, datapath=str(paths[1]), on_missing="skip", hidden_states_dtype=torch.float32
    )
    assert [arrow.data[i]["input_ids"].tolist() for i in range(len(truth))] == [
        expected(g) for g in truth
    ]  # in the stream's order


def test_specforge_writer_from_a_list_loads_with_specforge(samples, truth, head, tmp_path):
    from specforge.data.prompt_builder import prepare_prompt_tasks

    (path,) = EXPORTERS["specforge"].write(samples, head, tmp_path)  # type: ignore[misc]
    tasks = prepare_prompt_tasks(
        path,
        None,
        chat_template=None,
        max_length=1 << 20,
        is_preformatted=False,
        train_only_last_turn=False,
        cache_dir=None,
        cache_key=None,
        num_proc=None,
    )
    got = Counter(
        (tuple(t["payload"]["input_ids"]), tuple(t["payload"]["loss_mask"])) for t in tasks
    )
    assert got == Counter(
        (tuple(expected(g)), tuple([0] * len(g.prompt_ids or ()) + [1] * len(g.output_ids)))
        for g in truth
    )


def test_specforge_conversations_writer_from_a_list_of_answers(truth, bound, tmp_path: Path):
    answers = []
    for g in truth:
        k = key_of(g)
        stored = StoredResponse(k, "truth", {}, g.output_ids, g.prompt_ids, g.finish_reason, 0.0)
        prompt = Prompt(g.id, g.source, g.messages, g.tools)
        assert g.view is not None
        answers.append(Answered(k, prompt, g.messages, stored, g.view))
    system = bound.format.default_system
    e = EXPORTERS["specforge-conversations"]
    (path,) = e.write_conversations(iter(answers), tmp_path, system)  # type: ignore[misc]
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["id"] for r in recs] == [key_of(g).sample_id for g in truth]
    for r, g in zip(recs, truth, strict=True):
        assert r["lossy"] == e.lossy
        conv = r["conversations"]
        asked = [m["content"] for m in conv[:-1]]
        if g.messages[0].role == "system":  # its own system message stays, alone
            assert asked == [m.content for m in g.messages]
        else:  # the one the format renders in its place is written out
            assert conv[0] == {"role": "system", "content": system}
            assert asked[1:] == [m.content for m in g.messages]
        assert conv[-1]["role"] == "assistant" and g.view is not None
        assert conv[-1]["content"] == (g.view.content or "")
        assert ("tools" in r) == bool(g.tools)


def test_speculators_shards_roll_over_and_load_in_order(samples, truth, tmp_path, monkeypatch):
    """Past ``SHARD_BYTES`` the dataset goes on in the next shard, named as ``save_to_disk``
    names them; ``datasets`` and speculators' own reader see every row once, in order."""
    import torch
    from datasets import load_from_disk
    from speculators.train.data import ArrowDataset

    from draftdata.export.trainers import speculators as spec

    monkeypatch.setattr(spec, "SHARD_BYTES", 1)  # a shard per batch
    monkeypatch.setattr(spec, "BATCH_TOKENS", 1)  # a batch per sample
    out = spec.write_dataset(iter(samples * 3), tmp_path / "ds")
    files = sorted(p.name for p in out.glob("*.arrow"))
    n = len(samples) * 3
    assert files == [f"data-{i:05d}-of-{n:05d}.arrow" for i in range(n)]
    ds = load_from_disk(str(out))
    assert [r.tolist() for r in ds["input_ids"]] == [s.input_ids for s in samples * 3]
    arrow = ArrowDataset(max_len=4096, datapath=str(out), on_missing="skip", hidden_states_dtype=torch.float32)  # fmt: skip
    assert [arrow.data[i]["input_ids"].tolist() for i in range(n)] == [
        s.input_ids for s in samples * 3
    ]


#: a process writing the speculators dataset from a stream of SIZE samples of 20,000 tokens
#: (ids of no tokenizer: only their count matters here), printing its peak RSS in KB
_PEAK = """
import sys
from pathlib import Path
from draftdata.export.trainers.speculators import write_dataset
from draftdata.records import Provenance, Sample
prov = Provenance("x", "chatml", "1", "0")
n = int(sys.argv[1])
rows = (Sample(f"s{i}", list(range(i, i + 20_000)), [j > 99 for j in range(20_000)], 100,
               "engine", "stop", prov) for i in range(n))
write_dataset(rows, Path(sys.argv[2]))
print([ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0])
"""


def test_the_speculators_dataset_is_written_in_bounded_memory(tmp_path):
    """8x the tokens (0.8M -> 6.4M) costs under 48 MB more peak RSS (336 -> 332 MB when this
    was written): no batch holds more than ``BATCH_TOKENS`` and nothing is read back. Through
    ``save_to_disk``, which read its memory-mapped source whole, 403 -> 801 MB."""
    import subprocess
    import sys

    peaks = []
    for n in (40, 320):
        r = subprocess.run(
            [sys.executable, "-c", _PEAK, str(n), str(tmp_path / f"ds{n}")],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        peaks.append(int(r.stdout.split()[-1]) // 1024)
    assert peaks[1] - peaks[0] < 48, peaks


def test_export_row_groups_are_bounded_by_tokens(samples, tmp_path):
    """A row group is written once its rows hold ``BATCH_TOKENS`` tokens, whatever their number:
    2,048 rows of long answers (the old bound) held 340 MB of Python lists in the 2k
    rehearsal's export. Long samples here: each ground-truth sample's ids 40 times over."""
    import pyarrow.parquet as pq

    from draftdata.export.shards import BATCH_TOKENS

    long = [
        replace(s, id=f"{s.id}-{i}", input_ids=s.input_ids * 40, loss_mask=s.loss_mask * 40)
        for i in range(60)
        for s in samples
    ]
    total = sum(len(s.input_ids) for s in long)
    assert len(long) < 2048 and total > 3 * BATCH_TOKENS
    (entry,) = write_shards(iter(long), tmp_path)
    pf = pq.ParquetFile(tmp_path / entry.path)
    longest = max(len(s.input_ids) for s in long)
    sizes = []
    for g in range(pf.num_row_groups):
        ids = pf.read_row_group(g, columns=["input_ids"]).column("input_ids")
        sizes.append(sum(len(x) for x in ids.to_pylist()))
    assert sum(sizes) == total and len(sizes) >= 3
    assert max(sizes) < BATCH_TOKENS + longest, sizes
    _, rows = read_samples(tmp_path / entry.path)
    assert [s.input_ids for s in rows] == [s.input_ids for s in long]
