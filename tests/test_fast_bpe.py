"""The tiktoken fast path for byte-level BPE tokenizer.json files. The reference for every id is
the HF ``tokenizers`` library itself, loaded from the same document with its added vocabulary
removed (what plain-text encoding means here)."""

from __future__ import annotations

import json

import pytest

from conftest import PROMPTS, TOKENIZERS
from draftdata.tokenizers.fast_bpe import CORPUS
from draftdata.tokenizers.hf import HFTokenizer


def library(spec: dict) -> object:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps({**spec, "added_tokens": []}))


def spec_of(name: str) -> dict:
    return json.loads((TOKENIZERS / name / "tokenizer.json").read_text(encoding="utf-8"))


def texts() -> list[str]:
    convs = json.loads((PROMPTS / "sharegpt_v3_first1000.json").read_text())
    return [t["value"] for c in convs[:40] for t in c["conversations"]] + CORPUS


def tok_of(spec: dict, sha: str) -> HFTokenizer:
    return HFTokenizer(spec, path=TOKENIZERS, sha256=sha, kind="tokenizer.json")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fast-bpe-cache")


@pytest.fixture(autouse=True)
def own_cache(cache, monkeypatch):
    """A cache of this module's own, so each verdict here is made by these tests (once per
    name: the checks take a second or two per file)."""
    monkeypatch.setenv("DRAFTDATA_CACHE", str(cache))
    monkeypatch.delenv("DRAFTDATA_FAST_BPE", raising=False)


@pytest.mark.parametrize("name", ["llama3", "qwen3", "smollm2"])
def test_fast_path_gives_the_librarys_ids(name):
    spec = spec_of(name)
    tok = tok_of(spec, f"test-{name}")
    assert tok.encoder == "tiktoken (verified equal to tokenizers)"
    ref = library(spec)
    batch = texts()
    want = [e.ids for e in ref.encode_batch(batch, add_special_tokens=False)]
    assert tok.encode_batch(batch) == want
    assert [tok.encode(t) for t in batch[:20]] == want[:20]


def test_deepseek_pre_tokenizer_stays_on_the_library_with_its_reason():
    tok = tok_of(spec_of("deepseek-v3"), "test-deepseek")
    assert tok.encoder.startswith("tokenizers (the pre-tokenizer is a sequence of")


def test_merges_out_of_id_order_are_refused_and_the_library_encodes():
    spec = spec_of("smollm2")
    merges = spec["model"]["merges"]
    merges[100], merges[5000] = merges[5000], merges[100]  # HF's BPE changes; tiktoken's would not
    tok = tok_of(spec, "test-swapped")
    assert "listed after a merge that made id" in tok.encoder
    ref = library(spec)
    batch = texts()
    assert tok.encode_batch(batch) == [
        e.ids for e in ref.encode_batch(batch, add_special_tokens=False)
    ]


def test_bytes_without_a_token_go_to_the_library():
    """SmolLM2 has no token for some ASCII control bytes (HF drops them and may merge across
    the gap); text holding one is encoded by the library, the rest by tiktoken."""
    spec = spec_of("smollm2")
    tok = tok_of(spec, "test-bytes")
    assert tok.encoder.startswith("tiktoken")
    ref = library(spec)
    batch = ["ab\x04cd", "plain text", "x\x06\x06y \U00045678 z", "end"]
    want = [e.ids for e in ref.encode_batch(batch, add_special_tokens=False)]
    assert tok.encode_batch(batch) == want
    assert [tok.encode(t) for t in batch] == want


def test_the_verdict_is_cached_by_sha256_and_the_switch_turns_it_off(cache, monkeypatch):
    spec = spec_of("smollm2")
    tok_of(spec, "test-cache").encoder  # noqa: B018
    verdict = cache / "tokenizers" / "test-cache.fast-bpe.json"
    assert json.loads(verdict.read_text())["fast"] is True
    # loaded again on the cached verdict (ranks built the quick way): the same ids
    again = tok_of(spec, "test-cache")
    assert again.encoder.startswith("tiktoken")
    batch = texts()
    assert again.encode_batch(batch) == [
        e.ids for e in library(spec).encode_batch(batch, add_special_tokens=False)
    ]
    # a cached refusal is taken as it is (the checks are not run again)
    verdict.write_text(json.dumps({"checks": 1, "fast": False, "reason": "refused earlier"}))
    assert tok_of(spec, "test-cache").encoder == "tokenizers (refused earlier)"
    monkeypatch.setenv("DRAFTDATA_FAST_BPE", "0")
    assert tok_of(spec, "test-off").encoder == "tokenizers (DRAFTDATA_FAST_BPE=0)"
