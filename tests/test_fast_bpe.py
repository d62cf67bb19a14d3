"""The tiktoken fast path for byte-level BPE tokenizer.json files. The reference for every id is
the HF ``tokenizers`` library itself, loaded from the same document with its added vocabulary
removed (what plain-text encoding means here)."""

from __future__ import annotations

import json

import pytest

from conftest import PROMPTS, TOKENIZERS
from draftdata.tokenizers.fast_bpe import CHECKS_VERSION, CORPUS
from draftdata.tokenizers.hf import HFTokenizer
from draftdata.tokens.target import Target


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
    verdict.write_text(
        json.dumps({"checks": CHECKS_VERSION, "fast": False, "reason": "refused earlier"})
    )
    assert tok_of(spec, "test-cache").encoder == "tokenizers (refused earlier)"
    monkeypatch.setenv("DRAFTDATA_FAST_BPE", "0")
    assert tok_of(spec, "test-off").encoder == "tokenizers (DRAFTDATA_FAST_BPE=0)"


# --- the snapshot: a verified file loaded again without parsing it -----------------------------
def folder_copy(tmp_path, name: str):
    import shutil

    dst = tmp_path / name
    shutil.copytree(TOKENIZERS / name, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def stock(folder) -> object:
    """The library's own tokenizer of the file, with its added vocabulary (what it matches in
    text and how it decodes)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def sharegpt_answers(n: int) -> list[tuple[list, object]]:
    from draftdata.records import ApiView, Message

    out = []
    for conv in json.loads((PROMPTS / "sharegpt_v3_first1000.json").read_text())[:n]:
        turns = [t for t in conv["conversations"] if t.get("from") in ("human", "gpt")]
        if len(turns) >= 2 and turns[0]["from"] == "human" and turns[1]["from"] == "gpt":
            msgs = [Message(role="user", content=turns[0]["value"])]
            out.append((msgs, ApiView(content=turns[1]["value"], finish_reason="stop")))
    return out


@pytest.mark.parametrize(("name", "fmt"), [("llama3", "llama3"), ("qwen3", "qwen3")])
def test_a_verified_file_loads_again_from_its_snapshot_with_the_same_ids(name, fmt, tmp_path):
    from draftdata.formats import get_format

    folder = folder_copy(tmp_path, name)
    cold = HFTokenizer.from_folder(folder)
    assert cold.encoder.startswith("tiktoken") and cold._snap is None
    warm = HFTokenizer.from_folder(folder)
    assert warm._snap is not None and warm.sha256 == cold.sha256
    # the markers are checked, the answers laid out and the ids checked against the vocabulary
    # without the document being parsed
    b_cold, b_warm = (get_format(fmt).bind(t) for t in (cold, warm))
    assert b_warm.ids == b_cold.ids
    answers = sharegpt_answers(30)
    got = [Target(b_warm).reconstruct(m, v).input_ids for m, v in answers]
    assert "_full" not in warm.__dict__
    assert got == [Target(b_cold).reconstruct(m, v).input_ids for m, v in answers]
    # what the snapshot answers is what the library itself says about the file
    lib = stock(folder)
    assert warm.vocab_size == lib.get_vocab_size(with_added_tokens=True)
    for info in warm.control_tokens.values():
        assert (
            warm.encode_as_stock(info.text) == lib.encode(info.text, add_special_tokens=False).ids
        )
        assert warm.decode([info.id]) == lib.decode([info.id], skip_special_tokens=False)
    batch = texts()
    want = [e.ids for e in library(spec_of(name)).encode_batch(batch, add_special_tokens=False)]
    assert warm.encode_batch(batch) == want
    assert "_full" not in warm.__dict__
    # a question it does not answer parses the file then
    assert warm.token_to_id("Hello") == lib.token_to_id("Hello")
    assert warm.decode([9906, 1917]) == lib.decode([9906, 1917], skip_special_tokens=False)


def test_a_snapshot_is_not_taken_for_another_file_versions_or_a_broken_copy(tmp_path, cache):
    from draftdata.tokenizers import fast_bpe

    folder = folder_copy(tmp_path, "smollm2")
    first = HFTokenizer.from_folder(folder)
    first.encoder  # noqa: B018
    snap = cache / "tokenizers" / f"{first.sha256}.fast-bpe.snapshot"
    assert snap.exists()
    # the file changed: another sha256, another load from the document
    tj = folder / "tokenizer.json"
    tj.write_text(tj.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    changed = HFTokenizer.from_folder(folder)
    assert changed._snap is None and changed.sha256 != first.sha256
    # made by other versions: not read
    doc = fast_bpe.marshal.loads(snap.read_bytes())
    doc["stamp"] = {**doc["stamp"], "tokenizers": "0.0.1"}
    snap.write_bytes(fast_bpe.marshal.dumps(doc))
    assert fast_bpe.read_snapshot(first.sha256) is None
    # one whose stamp matches but which lacks what a load needs: not read
    doc["stamp"] = fast_bpe._stamp()
    snap.write_bytes(fast_bpe.marshal.dumps({k: v for k, v in doc.items() if k != "stock"}))
    assert fast_bpe.read_snapshot(first.sha256) is None
    snap.write_bytes(fast_bpe.marshal.dumps(doc))
    assert fast_bpe.read_snapshot(first.sha256) is not None
    # cut short: not read, and the next verified load writes it whole again
    snap.write_bytes(fast_bpe.marshal.dumps(doc)[:1000])
    assert fast_bpe.read_snapshot(first.sha256) is None
    tj.write_text(tj.read_text(encoding="utf-8").rstrip("\n"), encoding="utf-8")
    again = HFTokenizer.from_folder(folder)
    assert again._snap is None and again.sha256 == first.sha256
    again.encoder  # noqa: B018
    assert fast_bpe.read_snapshot(first.sha256) is not None


def test_a_file_changed_under_a_snapshot_load_is_named_when_it_is_parsed(tmp_path, monkeypatch):
    from draftdata.errors import TokenizerError

    folder = folder_copy(tmp_path, "smollm2")
    HFTokenizer.from_folder(folder).encoder  # noqa: B018
    warm = HFTokenizer.from_folder(folder)
    assert warm._snap is not None
    tj = folder / "tokenizer.json"
    tj.write_text(tj.read_text(encoding="utf-8") + " ", encoding="utf-8")
    with pytest.raises(TokenizerError, match="changed on disk since it was loaded"):
        warm.token_to_id("Hello")
    monkeypatch.setenv("DRAFTDATA_FAST_BPE", "0")  # the switch also turns the snapshot off
    tj.write_text(tj.read_text(encoding="utf-8").rstrip(" "), encoding="utf-8")
    off = HFTokenizer.from_folder(folder)
    assert off._snap is None and off.encoder == "tokenizers (DRAFTDATA_FAST_BPE=0)"
