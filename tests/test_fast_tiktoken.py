"""gigatoken in place of tiktoken for Kimi K2's rank file (tokenizers/fast_tiktoken.py), held to
tiktoken itself: the rank file read by tiktoken's own loader and split with the pattern of the
model's tokenization_kimi.py, on random strings over many Unicode categories and on every prompt
file in ../shared/data/prompts."""

from __future__ import annotations

import gzip
import json
import random

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from conftest import PROMPTS, TOKENIZERS, require
from draftdata.tokenizers import fast_tiktoken, load_tokenizer
from draftdata.tokenizers.tiktoken_file import TiktokenTokenizer, builtin_profiles
from draftdata.tokens import pool

require("gigatoken")  # a pinned dependency: missing is a failure, never a skip

KIMI = TOKENIZERS / "kimi-k2"
RANKS = KIMI / "tiktoken.model"


@pytest.fixture(scope="module")
def stock() -> tiktoken.Encoding:
    """Kimi's tokenizer as its own code builds it: tiktoken over the rank file, its pattern."""
    prof = next(p for p in builtin_profiles().values() if p["name"] == "kimi-k2")
    return tiktoken.Encoding(
        "kimi-k2-stock",
        pat_str="|".join(prof["pat_str"]),
        mergeable_ranks=load_tiktoken_bpe(str(RANKS)),
        special_tokens={},
    )


@pytest.fixture(scope="module")
def kimi() -> TiktokenTokenizer:
    tok = load_tokenizer(str(KIMI))
    assert isinstance(tok, TiktokenTokenizer)
    return tok


def _random_texts(n: int, seed: int) -> list[str]:
    ranges = [
        (0x20, 0x250),  # Latin, Latin-1, extended
        (0x300, 0x370),  # combining marks
        (0x370, 0x600),  # Greek, Cyrillic, Armenian, Hebrew
        (0x600, 0x700),  # Arabic (its own digits)
        (0x900, 0x980),  # Devanagari (spacing and non-spacing marks)
        (0x3040, 0x3100),  # kana
        (0x4E00, 0x4E80),  # Han
        (0xAC00, 0xAC40),  # Hangul
        (0xFF00, 0xFFF0),  # full-width and half-width forms
        (0x1F600, 0x1F650),  # emoji
    ]
    pool = [chr(c) for a, b in ranges for c in range(a, b)]
    pool += [chr(c) for c in (0x85, 0xA0, 0x1680, 0x2000, 0x2028, 0x2029, 0x202F, 0x3000)]
    pool += [chr(c) for c in (0x0B, 0x0C, 0x1C, 0x1D, 0x200B, 0xFEFF, 0x2160, 0x2460, 0xB2)]
    pool += list(" \t\n\r") * 20 + list("'sStTrReEvVmMlLdD") * 10 + list("0123456789") * 5
    rng = random.Random(seed)
    return ["".join(rng.choices(pool, k=rng.randint(1, 60))) for _ in range(n)]


def _prompt_texts() -> list[str]:
    """Every string in every prompt file (JSON, JSON lines, gzipped JSON lines)."""
    out: list[str] = []

    def walk(x: object) -> None:
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for path in sorted(PROMPTS.iterdir()):
        if path.name.endswith(".gz"):
            text = gzip.decompress(path.read_bytes()).decode("utf-8")
        elif path.name.endswith((".json", ".jsonl")):
            text = path.read_text(encoding="utf-8")
        else:
            continue
        try:  # one document, or JSON lines (BFCL's .json files are)
            walk(json.loads(text))
        except json.JSONDecodeError:
            walk([json.loads(line) for line in text.splitlines() if line.strip()])
    return out


def test_kimi_is_on_gigatoken_and_it_encodes_as_tiktoken(kimi, stock) -> None:
    assert kimi.encoder == fast_tiktoken.FAST
    texts = _random_texts(200_000, seed=1)
    want = stock.encode_ordinary_batch(texts)
    assert kimi.encode_batch(texts) == want
    arrays = kimi.encode_batch_arrays(texts)  # the same ids as int32 arrays (a Parquet file's)
    assert arrays is not None and {a.dtype.name for a in arrays} == {"int32"}
    assert [a.tolist() for a in arrays] == want


def test_arrays_that_differ_or_fail_on_the_corpus_keep_tiktoken(monkeypatch) -> None:
    """The load's corpus check holds gigatoken's arrays to tiktoken too."""

    def off_by_one(self, texts):  # type: ignore[no-untyped-def]
        return [a + 1 for a in own(self, texts)]

    def fails(self, texts):  # type: ignore[no-untyped-def]
        raise TypeError("a result of another shape")

    own = fast_tiktoken.FastTiktoken.encode_arrays
    monkeypatch.setattr(fast_tiktoken.FastTiktoken, "encode_arrays", off_by_one)
    tok = TiktokenTokenizer.from_file(RANKS)
    assert tok.encoder.startswith("tiktoken (gigatoken's ids differ on ")
    assert tok.encode_batch_arrays(_random_texts(10_000, seed=7)) is None
    monkeypatch.setattr(fast_tiktoken.FastTiktoken, "encode_arrays", fails)
    tok = TiktokenTokenizer.from_file(RANKS)
    assert tok.encoder == "tiktoken (gigatoken failed on the corpus: TypeError)"


def test_every_prompt_file_encodes_as_tiktoken(kimi, stock) -> None:
    texts = _prompt_texts()
    assert len(texts) > 10_000 and sum(map(len, texts)) > 5_000_000
    got = kimi.encode_batch(texts)
    want = stock.encode_ordinary_batch(texts)
    bad = [t[:60] for t, g, w in zip(texts, got, want, strict=True) if g != w]
    assert not bad, bad[:3]
    assert [kimi.encode(t) for t in texts[:2000]] == want[:2000]  # one text at a time too


def test_a_small_batch_stays_on_tiktoken_and_loads_nothing(stock) -> None:
    """gigatoken is loaded (75 MB) at the first batch of FAST_MIN_CHARS characters or more."""
    tok = TiktokenTokenizer.from_file(RANKS)  # not load_tokenizer's: that one is shared
    small = _random_texts(100, seed=4)
    assert tok.encode_batch(small) == stock.encode_ordinary_batch(small)
    assert "_fast_and_why" not in tok.__dict__
    big = _random_texts(10_000, seed=5)
    assert tok.encode_batch(big) == stock.encode_ordinary_batch(big)
    assert tok.__dict__["_fast_and_why"][1] == fast_tiktoken.FAST


def test_a_scheme_that_splits_otherwise_is_refused(monkeypatch) -> None:
    """A profile naming the wrong pre-tokenizer (GPT-4's for Kimi's ranks) stays on tiktoken:
    the corpus check shows the difference."""
    prof = next(p for p in builtin_profiles().values() if p["name"] == "kimi-k2")
    tok = TiktokenTokenizer.from_file(RANKS, profile={**prof, "gigatoken": "gpt4"})
    assert tok.encoder.startswith("tiktoken (gigatoken's ids differ on ")
    tok = TiktokenTokenizer.from_file(RANKS, profile={**prof, "gigatoken": "no-such-scheme"})
    assert tok.encoder == "tiktoken (gigatoken could not load it as 'no-such-scheme')"
    monkeypatch.setenv("DRAFTDATA_FAST_BPE", "0")
    assert TiktokenTokenizer.from_file(RANKS).encoder == "tiktoken (DRAFTDATA_FAST_BPE=0)"


def test_the_encoder_is_loaded_again_past_its_character_budget(kimi, stock, monkeypatch) -> None:
    """gigatoken's piece cache has no bound: past RELOAD_CHARS a fresh encoder replaces it, and
    the ids stay tiktoken's."""
    fast = kimi._fast_and_why[0]
    assert fast is not None
    monkeypatch.setattr(fast_tiktoken, "RELOAD_CHARS", 50_000)
    texts = _random_texts(8_000, seed=2)
    assert sum(map(len, texts)) >= fast_tiktoken.FAST_MIN_CHARS
    before = fast._tok
    assert kimi.encode_batch(texts) == stock.encode_ordinary_batch(texts)
    assert fast._tok is not before and fast._chars <= 50_000 + sum(map(len, texts))


_INHERITED: list[TiktokenTokenizer] = []


def _child_encode(texts: list[str]) -> list[list[int]]:
    return _INHERITED[0].encode_batch(texts)  # the parent's encoder, as the fork left it


def test_a_forked_worker_encodes_after_the_parent_has(kimi, stock) -> None:
    """`reconstruct -j` forks its workers after the parent may have encoded (gigatoken's thread
    pool does not survive a fork; a forked child encodes on its own thread)."""
    texts = _random_texts(20_000, seed=3)
    assert kimi.encode_batch(texts) == stock.encode_ordinary_batch(texts)
    _INHERITED[:] = [kimi]
    got = list(pool.ordered(_child_encode, [(texts[:10_000],), (texts[10_000:],)], 2))
    assert got[0] + got[1] == stock.encode_ordinary_batch(texts)


def _worker_encode(texts: list[str]) -> tuple[list[list[int]], bool]:
    fast_tiktoken.stay_on_tiktoken()
    tok = TiktokenTokenizer.from_file(RANKS)
    return tok.encode_batch(texts), "_fast_and_why" in tok.__dict__


def test_the_runs_tokens_stage_workers_stay_on_tiktoken(stock) -> None:
    """gigatoken cost each tokens-stage worker 150-190 MB at 40k prompts for 10% of its time:
    a process that says so (``run_workers._work``) encodes with tiktoken and never loads it."""
    texts = _random_texts(10_000, seed=6)
    # through the tokens stage's own pool, which resets the thread pools a fork copies
    [(got, loaded)] = list(pool.ordered(_worker_encode, [(texts,)], 1))
    assert got == stock.encode_ordinary_batch(texts) and not loaded
    assert fast_tiktoken.ON  # this process is untouched
