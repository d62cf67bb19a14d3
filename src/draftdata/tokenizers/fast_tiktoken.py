"""gigatoken in place of tiktoken for a rank file whose split pattern it implements natively.

tiktoken splits text with its profile's regex (``fancy_regex``) and then runs BPE on each piece;
for Kimi K2's pattern the regex is most of the time. gigatoken (PyPI) ships hand-written
pre-tokenizers for some models' patterns and keeps each piece's ids once it has encoded it. A
profile names the scheme it claims to match (``"gigatoken": "kimi"``); it is used only where that
is shown, else the tokenizer stays on tiktoken and the reason is kept (``Tokenizer.encoder``).
Only a batch of ``FAST_MIN_CHARS`` characters or more goes to it: one text, or a few, stay on
tiktoken, and gigatoken is loaded (and checked) at the first large batch:

- the profile names a scheme, gigatoken imports and loads the rank file with it;
- on every load, gigatoken and tiktoken give the same ids on a built-in corpus (``fast_bpe``'s,
  code, scripts, whitespace runs, contractions, plus the cases Kimi's pattern treats apart);
- the tests hold it to tiktoken on 200,000 random strings over many Unicode categories and on
  every prompt file in ``../shared/data/prompts``.

gigatoken's piece cache grows with every distinct piece it meets and has no bound, so an encoder
is loaded again (0.1-0.2 s) after ``RELOAD_CHARS`` characters: memory stays bounded on a run of
any length. Set ``DRAFTDATA_FAST_BPE=0`` to stay on tiktoken.

``encode_arrays`` gives the ids as int32 arrays over one buffer, not a Python int per token
(``reconstruct``'s Parquet path keeps them so to the Arrow column: building the lists was 0.23 s
of a worker's 0.3 s encode on 5,000 Kimi answers). The corpus check holds it to tiktoken too.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .fast_bpe import CORPUS

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger("draftdata.tokenizers")

#: the encoder line of a tokenizer on this fast path
FAST = "gigatoken (verified equal to tiktoken)"
#: characters one gigatoken encoder takes before a fresh one replaces it (its cache unbounded)
RELOAD_CHARS = 32_000_000
#: a batch of fewer characters stays on tiktoken (``TiktokenTokenizer``): one text through
#: gigatoken took 3.4 µs where tiktoken takes 1.5, and its first use loads 75 MB
FAST_MIN_CHARS = 1 << 17

#: False in a process that must not load gigatoken (``stay_on_tiktoken``)
ON = True


def enabled() -> bool:
    """Whether this process may use gigatoken (``stay_on_tiktoken`` not called)."""
    return ON


def without_awkward() -> None:
    """gigatoken's batch calls import ``awkward`` (0.12 s here, with its own imports) only to ask
    whether the input is an awkward Array; without it ``encode_batch`` gives one numpy array
    per text. A pool worker, which runs only draftdata's tasks and never holds an awkward
    Array, marks it unimportable unless something imported it already
    (``tokens.pool._start``)."""
    sys.modules.setdefault("awkward", None)  # type: ignore[arg-type]


def stay_on_tiktoken() -> None:
    """This process encodes with tiktoken from now on (the run's tokens-stage workers: there
    gigatoken's memory, 150-190 MB a worker at 40k prompts, buys 10% of their time)."""
    global ON
    ON = False


#: what Kimi's pattern treats apart from GPT-4's, on top of ``fast_bpe.CORPUS``
EXTRA = [
    "中文English混合text测试123456789 abc中文",
    "DON'T Don't don'T it'S he'LL we'VE I'M they'RE she'D ’s ʼs",
    "x\r\n\r\n  \r\n\t\n   y \n\n\n z  ",
    "Ελληνικά ΑΒΓ αβγ ǅungla ǈ ǋ Ὀδυσσεύς ᾈᾉ",
    "١٢٣٤ ۱۲۳ ௧௨ 一二三 ⅠⅡⅢ ①②③ ¹²³",
    "ﾃｽﾄ ｶﾀｶﾅ テスト ひらがな 한글 ㄱㄴ",
    "a\u0300\u0301\u0302 \u0915\u093f \u0e01\u0e34 \u200d\u200c",
    "  ...   !!!\n\n??? ---\r\n***   ",
]


class FastTiktoken:
    """A gigatoken encoder over one rank file, loaded again after ``RELOAD_CHARS``."""

    def __init__(self, path: Path, scheme: str, gigatoken: Any) -> None:
        self.path = path
        self.scheme = scheme
        self._gigatoken = gigatoken
        self._tok = self._load()
        self._chars = 0

    def _load(self) -> Any:
        return self._gigatoken.Tokenizer.from_tiktoken(str(self.path), pretokenizer=self.scheme)

    def _for(self, texts: Sequence[str]) -> tuple[Any, bool | None]:
        """The encoder for a batch of ``texts`` (a fresh one past the budget) and whether it
        may use gigatoken's thread pool (not in a forked worker, where gigatoken runs a batch on
        the calling thread, nor for a small batch: handing it over costs more than it saves)."""
        n = sum(map(len, texts))
        self._chars += n
        if self._chars > RELOAD_CHARS:
            self._tok, self._chars = self._load(), n
        return self._tok, None if n >= FAST_MIN_CHARS else False

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``texts`` encoded, in order."""
        tok, parallel = self._for(texts)
        out: list[list[int]] = tok.encode_batch_list(list(texts), parallel=parallel)
        return out

    def encode_arrays(self, texts: Sequence[str]) -> list[npt.NDArray[np.int32]]:
        """``texts`` encoded, in order, as int32 views of one buffer."""
        import numpy as np

        tok, parallel = self._for(texts)
        got = tok.encode_batch(list(texts), parallel=parallel)
        if isinstance(got, list):  # one uint32 array per text: awkward is not importable here
            lengths = [len(a) for a in got]
            flat = np.concatenate(got) if got else np.zeros(0, np.uint32)
        else:  # an awkward Array: one flat buffer and each text's length
            import awkward as ak

            lengths = ak.to_numpy(ak.num(got, axis=1)).tolist()
            flat = ak.to_numpy(ak.flatten(got, axis=1))
        ids = flat.astype(np.int32)  # ranks: every one below 2**31
        return np.split(ids, np.cumsum(lengths[:-1])) if lengths else []


def fast_tiktoken(
    path: Path, scheme: str | None, reference: Callable[[Sequence[str]], list[list[int]]]
) -> tuple[FastTiktoken | None, str]:
    """gigatoken for ``path`` where ``scheme`` names its pre-tokenizer and it encodes the corpus
    as ``reference`` (tiktoken) does; else None and why tiktoken stays."""
    if scheme is None:
        return None, "tiktoken"
    if os.environ.get("DRAFTDATA_FAST_BPE", "1") == "0":
        return None, "tiktoken (DRAFTDATA_FAST_BPE=0)"
    try:
        import gigatoken
    except ImportError:
        return None, "tiktoken (gigatoken is not installed)"
    try:
        fast = FastTiktoken(path, scheme, gigatoken)
    except Exception as e:  # gigatoken raises ValueError / its own Rust errors
        log.info("gigatoken could not load %s as %r: %s", path, scheme, e)
        return None, f"tiktoken (gigatoken could not load it as {scheme!r})"
    corpus = [*CORPUS, *EXTRA]
    try:
        lists, arrays = fast.encode_batch(corpus), fast.encode_arrays(corpus)
    except Exception as e:  # gigatoken's Rust errors, or a result of another shape
        log.info("gigatoken could not encode the corpus: %s", e)
        return None, f"tiktoken (gigatoken failed on the corpus: {type(e).__name__})"
    for text, want, got, arr in zip(corpus, reference(corpus), lists, arrays, strict=True):
        if want != got or want != arr.tolist():
            log.info("gigatoken differs from tiktoken on %r", text[:40])
            return None, f"tiktoken (gigatoken's ids differ on {text[:40]!r})"
    return fast, FAST
