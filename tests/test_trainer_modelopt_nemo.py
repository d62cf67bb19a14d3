"""ModelOpt's and NeMo Automodel's id exports loaded with their own dataset code
(``nvidia-modelopt`` 0.47.0 and ``nemo-automodel`` 0.7.0 from PyPI, installed by `make install`
with --no-deps). The samples are built from SmolLM2 ground-truth records, and what the trainers'
code returns is compared with the ground truth's own ids (prompt_ids + output_ids). Ids only:
the files the trainers train on hold hidden states too, and are tested on states captured from
the real model (tests/test_modelopt_recipe.py, tests/test_hidden_modelopt.py,
tests/test_nemo_cache.py)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import replace

import pytest

from conftest import GROUNDTRUTH, TOKENIZERS
from draftdata import __version__
from draftdata.export.trainers import EXPORTERS, LAYOUTS, TRAINERS
from draftdata.export.trainers import modelopt as mo
from draftdata.formats import get_format
from draftdata.records import Answered, GroundTruth, Key, Prompt, StoredResponse
from draftdata.records.export import ExportManifest, FormatPin, TokenizerPin
from draftdata.sources import read_ground_truth
from draftdata.tokenizers import load_tokenizer
from draftdata.tokens.target import Target

#: as many samples as the demo run exports
N = 44
PER_SOURCE = 8


@pytest.fixture(scope="module")
def bound():
    return get_format("chatml").bind(load_tokenizer(str(TOKENIZERS / "smollm2")))


def key_of(g: GroundTruth) -> Key:
    return Key(g.source, g.id, 0, 0)


def expected(g: GroundTruth) -> list[int]:
    assert g.prompt_ids is not None
    return [*g.prompt_ids, *g.output_ids]


def expected_mask(g: GroundTruth) -> list[int]:
    assert g.prompt_ids is not None
    return [0] * len(g.prompt_ids) + [1] * len(g.output_ids)


@pytest.fixture(scope="module")
def data(bound):
    """N ground-truth records that reconstruct exactly, in file order, at most PER_SOURCE from
    each source, and their samples."""
    truth, samples = [], []
    per: Counter[str] = Counter()
    for g in read_ground_truth(GROUNDTRUTH, Counter()):
        if g.view is None or g.prompt_ids is None or per[g.source] >= PER_SOURCE:
            continue
        s = Target(bound).reconstruct(
            g.messages, g.view, tools=g.tools, record_id=g.id, dataset=g.source
        )
        if s.input_ids != expected(g):
            continue
        k = key_of(g)
        per[g.source] += 1
        truth.append(g)
        samples.append(replace(s, id=k.sample_id, key=k))
        if len(truth) == N:
            break
    assert len(truth) == N
    assert {g.finish_reason for g in truth} == {"stop", "length"}
    assert len({g.source for g in truth}) > 1
    return truth, samples


@pytest.fixture(scope="module")
def head(bound) -> ExportManifest:
    tok, fmt = bound.tokenizer, bound.format
    return ExportManifest(
        run="modelopt-nemo",
        tokenizer=TokenizerPin(str(tok.path), tok.sha256, tok.chat_template_sha256),
        format=FormatPin(fmt.name, fmt.version),
        draftdata_version=__version__,
    )


def test_registry_names_both_trainers():
    assert {"modelopt", "nemo-automodel", "nemo-automodel-conversations"} <= set(EXPORTERS)
    assert EXPORTERS["modelopt"].lossy is None and EXPORTERS["nemo-automodel"].lossy is None
    assert EXPORTERS["nemo-automodel-conversations"].lossy is not None
    # both have an offline layout: ModelOpt's .pt files, NeMo Automodel's cache
    assert TRAINERS["modelopt"].layout is not None and "modelopt" in LAYOUTS
    assert TRAINERS["nemo-automodel"].layout is not None and "nemo-automodel" in LAYOUTS


def test_modelopt_ids_export_holds_our_ids_where_its_trainer_does_not_look(data, head, tmp_path):
    """``export --as modelopt``: the ids half of ModelOpt's offline dicts, one file per sample,
    named so that ModelOpt's trainer (``rglob("*.pt")`` under ``data.offline_data_path``) never
    takes it for a training file; with the settings ModelOpt needs beside them."""
    import torch

    from draftdata.export.trainers.settings import MODELOPT_EXPORT_SETTINGS

    truth, samples = data
    (out,) = EXPORTERS["modelopt"].write(iter(samples), head, tmp_path)  # type: ignore[misc]
    files = sorted(out.glob(f"*{mo.IDS_SUFFIX}"))
    assert [f.name for f in files] == [mo.ids_file_name(i) for i in range(N)]
    assert not list(tmp_path.rglob("*.pt"))
    assert (out / MODELOPT_EXPORT_SETTINGS).is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    got = 0
    for f, g, s in zip(files, truth, samples, strict=True):
        rec = torch.load(f, weights_only=True)
        assert set(rec) == {"id", "input_ids", "loss_mask"} and rec["id"] == s.id
        assert rec["input_ids"].dtype == torch.int64 and rec["input_ids"].tolist() == expected(g)
        assert rec["loss_mask"].tolist() == expected_mask(g)
        got += 1
    assert got == N  # 44 of 44


def test_offline_record_refuses_a_hidden_state_of_the_wrong_length():
    import torch

    from draftdata.errors import InputError

    with pytest.raises(InputError, match="hidden_states"):
        mo.offline_record(torch, "x", [1, 2, 3], [False, True, True], torch.zeros(2, 4))


def test_nemo_automodel_packing_returns_our_ids_and_masks(data, head, tmp_path):
    from nemo_automodel.components.datasets.llm.eagle3 import (
        _pack_collate,
        _stack_batch,
        build_packed_eagle3_dataset,
    )

    truth, samples = data
    (path,) = EXPORTERS["nemo-automodel"].write(iter(samples), head, tmp_path)  # type: ignore[misc]
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == [s.id for s in samples]

    # the unpadded path: one row per sample, stacked as NeMo stacks a batch
    got = 0
    for r, g in zip(rows, truth, strict=True):
        b = _stack_batch([r])
        assert b["input_ids"][0].tolist() == expected(g)
        assert b["loss_mask"][0].tolist() == expected_mask(g)
        assert b["attention_mask"][0].all()
        got += 1
    assert got == N  # 44 of 44

    # the packed path: documents split back at NeMo's own per-document position reset
    width = max(len(r["input_ids"]) for r in rows)
    packs = build_packed_eagle3_dataset(rows, packed_sequence_size=width, pad_token_id=0)
    batch = _pack_collate(packs)
    docs: list[tuple[list[int], list[int]]] = []
    for i in range(len(packs)):
        real = int(batch["attention_mask"][i].sum())
        ids = batch["input_ids"][i, :real].tolist()
        mask = batch["loss_mask"][i, :real].tolist()
        pos = batch["position_ids"][i, :real].tolist()
        starts = [j for j, p in enumerate(pos) if p == 0] + [real]
        docs += [(ids[a:b], mask[a:b]) for a, b in itertools.pairwise(starts)]
    assert docs == [(expected(g), expected_mask(g)) for g in truth]
    assert len(packs) < N  # packed, several documents a row


def answered(truth: list[GroundTruth]) -> list[Answered]:
    out = []
    for g in truth:
        k = key_of(g)
        stored = StoredResponse(k, "truth", {}, g.output_ids, g.prompt_ids, g.finish_reason, 0.0)
        assert g.view is not None
        out.append(
            Answered(k, Prompt(g.id, g.source, g.messages, g.tools), g.messages, stored, g.view)
        )
    return out


def test_nemo_automodel_conversations_are_lossy_in_its_chat_dataset(data, bound, tmp_path):
    """NeMo's ChatDataset reads the conversations and renders them itself: how many of its ids
    and masks agree with the model's is measured here, and the rows are labelled lossy."""
    from nemo_automodel.components.datasets.llm.chat_dataset import ChatDataset
    from transformers import AutoTokenizer

    truth, _ = data
    e = EXPORTERS["nemo-automodel-conversations"]
    system = bound.format.default_system
    (path,) = e.write_conversations(iter(answered(truth)), tmp_path, system)  # type: ignore[misc]
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert all(r["lossy"] == e.lossy for r in recs)
    assert all(r["messages"][-1]["role"] == "assistant" for r in recs)

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS / "smollm2"))
    # the recipe's best setting: the role header the template supplies is not trained
    ds = ChatDataset(str(path), tokenizer=tok, unshifted=True, mask_generation_prompt=True)
    assert len(ds) == N
    nl = tok.encode("\n", add_special_tokens=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    exact = prefix = mask_same = 0
    for i, g in enumerate(truth):
        item = ds[i]
        ours, n = expected(g), len(expected(g))
        exact += item["input_ids"] == ours
        # the render appends what the model never produced: a newline after the end marker,
        # and an end marker after an answer cut at max_tokens; both trained
        tail = nl if g.finish_reason == "stop" else [end, *nl]
        assert item["input_ids"] == ours + tail
        assert item["loss_mask"][n:] == [1] * len(tail)
        prefix += 1
        # on our span the mask agrees except in multi-turn records, where it also trains the
        # earlier assistant turns
        mask_same += item["loss_mask"][:n] == expected_mask(g)
    multi = sum(sum(m.role == "assistant" for m in g.messages) > 0 for g in truth)
    assert (exact, prefix, mask_same) == (0, N, N - multi)
    assert 0 < multi < N
