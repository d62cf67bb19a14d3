"""Text never becomes a control token, the same way in every kind of tokenizer, through the one
check in ``Tokenizer.encode_batch``.

Expected values come from the tokenizer files: each file's own special-token table
(``added_tokens`` of tokenizer.json; ``added_tokens_decoder`` of Kimi's tokenizer_config.json)
and its vocabulary or rank lines, and the stock libraries' encodings of them. The real files keep
their special strings as text; files derived from them, where a control token is also what
ordinary text encodes to, are refused by ``encode_batch`` and ``encode`` alike, on each of the
three encoders (tokenizers; tiktoken with tokenizers for the text it cannot take; tiktoken)."""

from __future__ import annotations

import base64
import json
import unicodedata
from pathlib import Path

import pytest

from conftest import TOKENIZERS
from draftdata.errors import SpecialTokenInTextError
from draftdata.tokenizers import load_tokenizer
from draftdata.tokenizers.fast_bpe import FAST
from draftdata.tokenizers.tiktoken_file import builtin_profiles

HF = ["smollm2", "qwen3", "llama3", "deepseek-v3"]


def file_specials(key: str) -> dict[int, str]:
    """The special/added tokens the tokenizer's own files list: id -> text."""
    if key == "kimi-k2":
        cfg = json.loads((TOKENIZERS / key / "tokenizer_config.json").read_text())
        return {int(i): e["content"] for i, e in cfg["added_tokens_decoder"].items()}
    spec = json.loads((TOKENIZERS / key / "tokenizer.json").read_text())
    return {int(a["id"]): a["content"] for a in spec["added_tokens"]}


@pytest.mark.parametrize("key", [*HF, "kimi-k2"])
def test_special_strings_in_text_stay_text_in_every_kind(load, key):
    tok = load(key)
    specials = file_specials(key)
    assert len(specials) >= 17, key
    # the strings are the file's control tokens: the stock encoder matches each as its id
    for tid, text in specials.items():
        assert tok.control_by_text[text].id == tid
        assert tok.encode_as_stock(text) == [tid], (key, text)
    words = [t for t in specials.values() if t.strip()]
    texts = [
        *words,
        *(f"a{t}b" for t in words),
        *(f" {t} \n" for t in words),
        "say " + " and ".join(words) + " then stop",
    ]
    got = tok.encode_batch(texts)
    assert got == [tok.encode(t) for t in texts]
    for text, ids in zip(texts, got, strict=True):
        assert not specials.keys() & set(ids), (key, text)
        want = unicodedata.normalize("NFC", text) if key == "qwen3" else text
        assert tok.decode(ids) == want
    if key in HF:  # and as the tokenizers library encodes the file without its added tokens
        from tokenizers import Tokenizer as Library

        spec = json.loads((TOKENIZERS / key / "tokenizer.json").read_text())
        plain = Library.from_str(json.dumps({**spec, "added_tokens": []}))
        assert got == [e.ids for e in plain.encode_batch(texts, add_special_tokens=False)]


def hf_with_control(tmp_path: Path, entry: str) -> tuple[Path, int]:
    """SmolLM2's tokenizer.json with its vocabulary entry ``entry`` listed as a special token
    too (same id): ordinary text that encodes to that entry now holds a control id."""
    spec = json.loads((TOKENIZERS / "smollm2" / "tokenizer.json").read_text())
    tid = spec["model"]["vocab"][entry]
    spec["added_tokens"].append(
        {
            "id": tid,
            "content": entry,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return path, tid


def tiktoken_with_control(tmp_path: Path, piece: bytes) -> tuple[Path, int]:
    """Kimi's rank file with a special token placed at the rank id of ``piece`` (read from the
    file's own lines)."""
    src = TOKENIZERS / "kimi-k2" / "tiktoken.model"
    lines = src.read_bytes().splitlines()
    (tid,) = [int(r) for t, r in (ln.split() for ln in lines if ln) if base64.b64decode(t) == piece]
    rank = tmp_path / "tiktoken.model"
    rank.write_bytes(src.read_bytes())
    (pat,) = [p["pat_str"] for p in builtin_profiles().values() if p["name"] == "kimi-k2"]
    profile = {"name": "kimi-overlap", "pat_str": pat, "special_start": tid}
    profile["special_tokens"] = ["<|overlap|>"]
    (tmp_path / "tiktoken.model.profile.json").write_text(json.dumps(profile))
    return rank, tid


@pytest.mark.parametrize(
    ("kind", "text"),
    [("tokenizers", "see the cat"), ("tiktoken+tokenizers", "wow!"), ("tiktoken", "see the cat")],
)
def test_text_that_encodes_to_a_control_id_is_refused_by_every_kind(tmp_path, kind, text):
    if kind == "tokenizers":  # " the" is what a merge makes: tiktoken cannot take the file
        path, tid = hf_with_control(tmp_path, "\u0120the")
        name = "\u0120the"
    elif kind == "tiktoken+tokenizers":  # "!" is a byte: tiktoken hands its text to tokenizers
        path, tid = hf_with_control(tmp_path, "!")
        name = "!"
    else:
        path, tid = tiktoken_with_control(tmp_path, b" the")
        name = "<|overlap|>"
    tok = load_tokenizer(path)
    if kind == "tokenizers":
        assert tok.encoder.startswith("tokenizers (control token")
    elif kind == "tiktoken+tokenizers":
        assert tok.encoder == FAST
    assert tok.control_by_text[name].id == tid
    plain = "a plain line"
    ok = tok.encode_batch([plain])
    assert tid not in ok[0] and tok.decode(ok[0]) == plain
    with pytest.raises(SpecialTokenInTextError) as batch:
        tok.encode_batch([plain, text])
    with pytest.raises(SpecialTokenInTextError) as single:
        tok.encode(text)
    for e in (batch, single):
        msg = str(e.value)
        assert f"control token(s) [{tid}] ({tid} = {name!r})" in msg
        assert f"near {text!r}" in msg and "report it with the text attached" in msg
    assert "text 2 of 2 in the batch" in str(batch.value)
