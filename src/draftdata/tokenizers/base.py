"""The one tokenizer protocol draftdata uses, whatever file the tokenizer came from."""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..errors import SpecialTokenInTextError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

TokenKind = Literal["special", "added", "ordinary"]


@dataclass(frozen=True)
class TokenInfo:
    """A control token: ``special`` tokens are skipped by decode(skip_special_tokens=True);
    ``added`` tokens are non-special entries of the added vocabulary (HF matches them in text)."""

    id: int
    text: str
    kind: TokenKind


#: a batch smaller than this many characters is encoded in the calling thread
SERIAL_CHARS = 1 << 16
_POOL: ThreadPoolExecutor | None = None


def encode_threaded(encode: Callable[[str], list[int]], texts: Sequence[str]) -> list[list[int]]:
    """``encode`` over ``texts``, in order: a large batch in one chunk per core on a pool kept
    for the process (tiktoken releases the GIL while it encodes; its own batch call starts a
    new 8-thread pool and submits every text, which costs more than it saves on short texts)."""
    global _POOL
    total = sum(map(len, texts))
    if len(texts) <= 1 or total < 2 * SERIAL_CHARS:  # one chunk (os.cpu_count costs µs)
        return [encode(t) for t in texts]
    n = min(os.cpu_count() or 1, len(texts), total // SERIAL_CHARS)
    if n <= 1:
        return [encode(t) for t in texts]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="draftdata-encode")
    bounds, acc, step = [0], 0, total / n
    for i, t in enumerate(texts):
        acc += len(t)
        if acc >= step * len(bounds) and len(bounds) < n:
            bounds.append(i + 1)
    bounds.append(len(texts))
    chunks = [texts[a:b] for a, b in pairwise(bounds) if b > a]
    futures = [_POOL.submit(lambda c: [encode(t) for t in c], c) for c in chunks]
    return [ids for f in futures for ids in f.result()]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Tokenizer(ABC):
    """Encode ordinary text, decode ids, and describe the control tokens of one real tokenizer.

    ``encode`` never produces a special or added token: control tokens enter token sequences only
    as ids chosen by a chat format. Subclasses read files only in their ``from_*`` constructors.
    """

    #: a short human name, e.g. ``tokenizer.json`` or ``tiktoken:kimi-k2``
    kind: str
    #: where it was loaded from
    path: Path
    #: sha256 of the file that defines the vocabulary
    sha256: str
    #: the chat template shipped with the tokenizer, if any
    chat_template: str | None

    @property
    def chat_template_sha256(self) -> str | None:
        tpl = self.chat_template
        return hashlib.sha256(tpl.encode()).hexdigest() if tpl else None

    # --- the hot path -------------------------------------------------------------------
    @abstractmethod
    def _encode_ordinary(self, text: str) -> list[int]:
        """Encode text with no control-token matching at all."""

    def _encode_ordinary_batch(self, texts: Sequence[str]) -> tuple[list[list[int]], Sequence[int]]:
        """``_encode_ordinary`` over ``texts``, in order, and the positions of the results that
        did not come from tiktoken's ranks (``_rank_ids``): here, all of them."""
        return [self._encode_ordinary(t) for t in texts], range(len(texts))

    @property
    def _rank_ids(self) -> Collection[int]:
        """Every id tiktoken's ``encode_ordinary`` can give here: the ids of its mergeable ranks
        (it matches no special token). Empty where no tiktoken encodes."""
        return ()

    @cached_property
    def _ranks_hold_control(self) -> bool:
        return not self.control_ids.isdisjoint(self._rank_ids)

    def encode(self, text: str) -> list[int]:
        """Encode ordinary text. Raises if the result would contain a control token."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode ordinary texts, in order: the one check that text never becomes a control
        token. A result holding a control id raises ``SpecialTokenInTextError``, naming the first
        such text. Only the results of tiktoken's ranks go unchecked, and only when no rank's id
        is a control id (checked once): those cannot hold one."""
        out, others = self._encode_ordinary_batch(texts)
        control = self.control_ids
        for i in range(len(out)) if self._ranks_hold_control else others:
            if not control.isdisjoint(out[i]):
                raise self._control_in_text(texts[i], out[i], i, len(texts))
        return out

    def encode_batch_arrays(self, texts: Sequence[str]) -> list[npt.NDArray[np.int32]] | None:
        """``encode_batch`` as int32 arrays, where this tokenizer gives its ids so with nothing
        left to check (gigatoken over tiktoken ranks that hold no control id, a large batch);
        else None, and the caller encodes with ``encode_batch``."""
        return None

    def _control_in_text(
        self, text: str, ids: Sequence[int], index: int, n: int
    ) -> SpecialTokenInTextError:
        control = self.control_ids
        bad = sorted(control.intersection(ids))
        names = ", ".join(f"{i} = {self.control_tokens[i].text!r}" for i in bad)
        k = next(j for j, i in enumerate(ids) if i in control)
        near = self.decode(ids[max(0, k - 8) : k + 9])
        where = f"text {index + 1} of {n} in the batch, " if n > 1 else ""
        return SpecialTokenInTextError(
            f"encoding plain text produced control token(s) {bad} ({names}) with {self.kind} "
            f"({where}{len(text)} characters, near {near!r}); this tokenizer cannot keep that "
            "text as text — report it with the text attached"
        )

    @property
    def encoder(self) -> str:
        """Which library encodes ordinary text, and why (overridden where there is a choice)."""
        return self.kind

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Decode ids to text; control tokens decode to their text; bad UTF-8 becomes U+FFFD."""

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (a control token: its UTF-8 text)."""

    @abstractmethod
    def encode_as_stock(self, text: str) -> list[int]:
        """Encode the way the stock library does by default (control tokens matched in text).

        Only the audit uses this, to show what a naive pipeline would do. Never build data with it.
        """

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def control_tokens(self) -> dict[int, TokenInfo]:
        """Every special and added token, by id."""

    @abstractmethod
    def token_to_id(self, text: str) -> int | None:
        """The id whose vocabulary entry is exactly ``text`` (control tokens by their text)."""

    # --- derived ------------------------------------------------------------------------
    @cached_property
    def control_ids(self) -> frozenset[int]:
        return frozenset(self.control_tokens)

    @cached_property
    def control_by_text(self) -> dict[str, TokenInfo]:
        return {t.text: t for t in self.control_tokens.values()}

    @property
    def unrepresentable_bytes(self) -> frozenset[int]:
        """Bytes with no token of their own: text containing them cannot round-trip (the BPE
        drops them). Empty for complete byte-level vocabularies."""
        return frozenset()

    @cached_property
    def ordinary_ids_by_bytes(self) -> dict[bytes, int]:
        """Raw bytes -> the (first) ordinary id that stands for them; built once, on demand."""
        from ..errors import TokenizerError

        index: dict[bytes, int] = {}
        for i in range(self.vocab_size):
            if i in self.control_tokens:
                continue
            try:
                index.setdefault(self.token_bytes(i), i)
            except TokenizerError:  # holes in a vocabulary
                continue
        return index

    def kind_of(self, token_id: int) -> TokenKind:
        info = self.control_tokens.get(token_id)
        return info.kind if info else "ordinary"

    def token_str(self, token_id: int) -> str:
        """A readable rendering of one token for reports: control text, or decoded bytes."""
        info = self.control_tokens.get(token_id)
        if info:
            return info.text
        return self.token_bytes(token_id).decode("utf-8", errors="backslashreplace")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.path} vocab={self.vocab_size}>"
