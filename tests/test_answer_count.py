"""An answer's own count on the request path (``generate.backends.charges.answer_tokens``): where
nothing depends on it, it is not counted, on the bound that a text of B UTF-8 bytes is at most
B + 1 tokens. The bound is checked on every real tokenizer of ../shared, on real answers and on
the texts that would break it if any could."""

from __future__ import annotations

import json

import pytest

from conftest import GROUNDTRUTH, TOKENIZERS
from draftdata.records import ApiView, ToolCall
from draftdata.tokenizers import load_tokenizer

NAMES = sorted(
    p.name
    for p in TOKENIZERS.iterdir()
    if (p / "tokenizer.json").exists() or (p / "tiktoken.model").exists()
)
HARD = [
    "",
    " ",
    "\n" * 64,
    " " * 257,
    "a",
    " a",
    "é",
    "e\u0301" * 40,  # combining marks
    "日本語のテキスト、句読点。" * 8,
    "🙂🚀👩‍👩‍👧‍👦" * 20,  # 4-byte characters and joiners
    "\u200b\ufeff" * 30,
    "\x00\x01\x7f",
    "<|im_end|><think></think>",  # special tokens' text is ordinary text here
    "0123456789" * 30,
]


@pytest.mark.parametrize("name", NAMES)
def test_a_text_is_at_most_its_bytes_plus_one_tokens(name):
    tok = load_tokenizer(str(TOKENIZERS / name))
    texts = list(HARD)
    for line in GROUNDTRUTH.read_text().splitlines()[:200]:
        view = json.loads(line)["api_view"]
        texts += [view.get("content") or "", view.get("reasoning") or ""]
    for t in texts:
        n = len(tok.encode(t))
        assert n <= len(t.encode("utf-8", "surrogatepass")) + 1, (name, t[:40], n)


class Counting:
    """A tokenizer that counts its encodes (the real one does the work)."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def encode(self, text):
        self.calls += 1
        return self.tok.encode(text)


def test_an_answer_is_counted_only_where_something_depends_on_it():
    from draftdata.generate.backends.charges import answer_tokens

    tok = Counting(load_tokenizer(str(TOKENIZERS / "smollm2")))
    view = ApiView("Paris is the capital of France.", "stop", reasoning="The user asks.")
    calls = ApiView(None, "tool_calls", tool_calls=(ToolCall("f", '{"a": 1}'),))
    exact = len(tok.tok.encode(view.content)) + len(tok.tok.encode(view.reasoning))
    # priced: always counted, exactly
    assert answer_tokens(tok, view, priced=True, most=1e9, reported=exact) == exact
    assert tok.calls == 2
    # not priced, and too short to pass the limit: not encoded at all
    assert answer_tokens(tok, view, priced=False, most=100, reported=None) is None
    assert tok.calls == 2
    # not priced, long enough in bytes that it could pass the limit, and the server's count
    # is plausible for its bytes: that count settles the limit
    assert answer_tokens(tok, view, priced=False, most=10, reported=exact) is None
    assert tok.calls == 2
    # ... but not where the server gave none, or one too small for the bytes: counted
    assert answer_tokens(tok, view, priced=False, most=10, reported=None) == exact
    assert answer_tokens(tok, view, priced=False, most=10, reported=1) == exact
    assert tok.calls == 6
    got = answer_tokens(tok, calls, priced=True, most=0, reported=None)
    assert got == len(tok.tok.encode('f{"a": 1}'))
