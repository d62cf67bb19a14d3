"""A tiktoken fast path for byte-level BPE ``tokenizer.json`` files (Llama 3, Qwen3, SmolLM2).

tiktoken runs the same algorithm as a byte-level BPE in HF ``tokenizers`` when the two agree on
everything around it; it is used only where that is shown, else the tokenizer stays on
``tokenizers`` and the reason is kept (``HFTokenizer.encoder``):

- the pipeline: no normalizer or NFC (applied before tiktoken), a pre-tokenizer that is one
  regex (one isolating ``Split`` followed by a ``ByteLevel`` that does not split again, or a
  ``ByteLevel`` that splits with GPT-2's pattern), a BPE model with no dropout, byte fallback
  or word prefixes/suffixes, and all 256 bytes in the vocabulary;
- the ranks: a token's id is its rank. tiktoken merges the adjacent pair whose joined bytes have
  the lowest rank; HF merges the pair listed first among the merges. Those agree when the merges
  are listed in the order of the ids they produce (several merges may produce one token), and
  when every token is what BPE makes of its own bytes (tiktoken takes a whole piece that is a
  token at once; HF runs the merges, unless the model says ``ignore_merges``);
- the result: both encoders on a built-in corpus (code, many scripts, whitespace runs, digits,
  contractions) give the same ids.

The verdict is cached by the file's sha256, so the checks (a second or two) run once per file.
Set ``DRAFTDATA_FAST_BPE=0`` to stay on ``tokenizers``.

A file the fast path was verified on also leaves a *snapshot* (``read_snapshot``): its ranks,
pattern and normalizer, and what the stock tokenizer answered about its added vocabulary, under
the file's sha256 and the versions of tiktoken, tokenizers and Python that verified it. Loading
that same file again with those same versions reads the snapshot instead of parsing the document
twice (JSON, then ``tokenizers``' own parse of its merges: about 80% of a load), which is what
every worker process of a large ``reconstruct`` pays before its first record. The snapshot holds
answers the checks above already gave; any other question goes to ``tokenizers``, parsed then.
"""

from __future__ import annotations

import contextlib
import json
import logging
import marshal
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..files import write_bytes
from .base import encode_threaded

log = logging.getLogger("draftdata.tokenizers")

#: bump when the checks change: cached verdicts of older checks are made again
CHECKS_VERSION = 2
#: the encoder line of a tokenizer on the verified fast path
FAST = "tiktoken (verified equal to tokenizers)"
#: bump when what a snapshot holds changes
SNAPSHOT_VERSION = 1
#: what a snapshot holds besides its stamp (the last five: ``HFTokenizer._facts``)
SNAPSHOT_KEYS = frozenset(
    {
        "sha256",
        "pattern",
        "normalizer",
        "ranks",
        "added",
        "vocab_size",
        "missing_bytes",
        "stock",
        "decoded",
    }
)

#: the pattern GPT-2's byte-level pre-tokenizer splits with (``ByteLevel(use_regex=true)``)
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

#: text both encoders must agree on before the fast one is used
CORPUS = [
    "Hello, world! It's a test: we'll see, they've done it, I'M SURE, you'd say so.",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\n\tpass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * 3.14159; }\r\n",
    "    leading spaces, trailing spaces    \n\n\n  \t \n x",
    "1234567890 12 345 6789 0.5 -42 1e-9 3,000,000 ２０２６年",
    "Ünïcödé: café naïve façade São Paulo Zürich Ελληνικά русский язык",
    "中文文本测试，包括标点。日本語のテキスト、カタカナ。한국어 텍스트입니다.",
    "العربية نص تجريبي हिन्दी पाठ ภาษาไทย עברית",
    "emoji 🙂👍🏽👨‍👩‍👧 and symbols ™ © ® ∑ ∫ √ → ⇒ ≠ ≤",
    "e\u0301 a\u0308 n\u0303 (combining marks) \u00e9 \u00e4",
    '<|im_start|>user\n<think>\n\n</think>\n\n<tool_call>{"name": "f"}</tool_call>',
    "a" * 300 + " " * 50 + "\n" * 20 + "!" * 40 + "ab" * 100,
    "MixedCASE camelCase snake_case kebab-case SCREAMING_SNAKE 'quoted' \"double\"",
    "\u00a0non-breaking\u2009thin\u3000ideographic space\u200bzero-width",
    "control \x00\x04\x06\x13\x1b\x7f bytes, rare planes \U00040000\U0008ffff\U000e0001 end",
]


def cache_dir() -> Path:
    root = os.environ.get("DRAFTDATA_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "draftdata"
    return base / "tokenizers"


def pattern_of(spec: dict[str, Any]) -> tuple[str | None, str]:
    """The one regex the pre-tokenizer splits with, or None and why it is not one."""
    pre = spec.get("pre_tokenizer") or {}
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            return None, "ByteLevel pre-tokenizer adds a prefix space or does not split"
        return GPT2_PATTERN, ""
    if kind == "Sequence":
        parts = pre.get("pretokenizers") or []
        if (
            len(parts) == 2
            and parts[0].get("type") == "Split"
            and parts[1].get("type") == "ByteLevel"
        ):
            split, byte_level = parts
            regex = (split.get("pattern") or {}).get("Regex")
            if (
                isinstance(regex, str)
                and split.get("behavior") == "Isolated"
                and not split.get("invert")
                and not byte_level.get("add_prefix_space")
                and not byte_level.get("use_regex", True)
            ):
                return regex, ""
        return None, f"the pre-tokenizer is a sequence of {len(parts)} steps, not one regex"
    return None, f"pre-tokenizer {kind!r} is not a byte-level regex split"


def normalizer_of(spec: dict[str, Any]) -> tuple[Callable[[str], str] | None, str]:
    """The normalization to apply before tiktoken (identity or NFC), or None and why not."""
    return _normalizer(spec.get("normalizer"))


def _normalizer(norm: Any) -> tuple[Callable[[str], str] | None, str]:
    if norm is None or (norm.get("type") == "Sequence" and not norm.get("normalizers")):
        return (lambda t: t), ""
    if norm.get("type") == "NFC":
        return (
            lambda t: t if unicodedata.is_normalized("NFC", t) else unicodedata.normalize("NFC", t)
        ), ""
    return None, f"normalizer {norm.get('type')!r} has no tiktoken equivalent"


def _merges(model: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1])  # type: ignore[misc]
        for m in model.get("merges") or []
    ]


def ranks_of(
    spec: dict[str, Any], control: set[int], byte_decoder: dict[str, int], plain: Any
) -> tuple[dict[bytes, int] | None, str]:
    """tiktoken ranks (bytes -> id) of the ordinary vocabulary, or None and why they would not
    give HF's ids. ``plain`` is the HF tokenizer without its added vocabulary."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None, f"model {model.get('type')!r} is not BPE"
    for flag in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(flag):
            return None, f"the BPE model sets {flag}"
    if model.get("byte_fallback"):
        return None, "the BPE model falls back to bytes"
    vocab: dict[str, int] = model.get("vocab") or {}
    ranks: dict[bytes, int] = {}
    for text, i in vocab.items():
        if i in control:
            continue  # control tokens enter only as ids chosen by a format
        try:
            raw = bytes(byte_decoder[c] for c in text)
        except KeyError:
            return None, f"vocabulary entry {text!r} is not in the byte-level alphabet"
        if raw in ranks:
            return None, f"two vocabulary entries stand for the bytes {raw!r}"
        ranks[raw] = i
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if any(0x80 <= b < 0xC0 for b in missing):
        return None, "a UTF-8 continuation byte has no token of its own"
    produced: dict[str, int] = {}
    last = -1
    for n, (a, b) in enumerate(_merges(model)):
        t = vocab.get(a + b)
        if t is None:
            return None, f"merge {n} ({a!r}, {b!r}) makes a token the vocabulary lacks"
        if t < last:
            return None, f"merge {n} makes id {t}, listed after a merge that made id {last}"
        last = t
        produced.setdefault(a + b, n)
    for text, i in vocab.items():
        if i in control and text in produced:  # left out of the ranks: tiktoken cannot make it
            return None, (
                f"control token {i} ({text!r}) is what merge {produced[text]} makes: ordinary "
                "text can become it, and only tokenizers encodes that text as HF does (and "
                "Tokenizer.encode_batch refuses it)"
            )
    if not model.get("ignore_merges"):
        bpe = plain.model
        for text, i in vocab.items():
            if len(text) < 2 or i in control:
                continue
            got = bpe.tokenize(text)
            if len(got) != 1 or got[0].id != i:
                return None, (
                    f"token {i} is not what BPE makes of its own bytes (tiktoken would take "
                    "it whole)"
                )
    return ranks, ""


def verify(fast: Callable[[str], list[int]], plain: Any, corpus: Sequence[str]) -> str:
    """'' when both encoders give the same ids on ``corpus``, else the first difference."""
    want = [list(e.ids) for e in plain.encode_batch(list(corpus), add_special_tokens=False)]
    for text, ids in zip(corpus, want, strict=True):
        got = fast(text)
        if got != ids:
            return f"ids differ from tokenizers' on {text[:40]!r}"
    return ""


def byte_guard(missing: Sequence[int]) -> re.Pattern[str] | None:
    """A pattern matching the characters whose UTF-8 holds one of the ``missing`` bytes (HF
    drops such a byte and may merge across the gap; tiktoken cannot), None when there are none.
    A missing ASCII byte is its character; a missing lead byte, the code points it starts;
    bytes that never occur in UTF-8 (C0, C1, F5-FF) match nothing."""
    parts = []
    for b in missing:
        if b < 0x80:
            lo = hi = b
        elif 0xC2 <= b <= 0xDF:
            lo = (b & 0x1F) << 6
            hi = lo + 0x3F
        elif 0xE0 <= b <= 0xEF:
            lo = max((b & 0x0F) << 12, 0x800)
            hi = ((b & 0x0F) << 12) + 0xFFF
        elif 0xF0 <= b <= 0xF4:
            lo = max((b & 0x07) << 18, 0x10000)
            hi = min(((b & 0x07) << 18) + 0x3FFFF, 0x10FFFF)
        else:
            continue
        parts.append(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}")
    return re.compile(f"[{''.join(parts)}]") if parts else None


class FastBPE:
    """tiktoken encoding ordinary text for one tokenizer.json, with its normalizer. Text with a
    character whose bytes have no token (``guard``) goes to ``tokenizers`` instead (``plain``
    gives the library's tokenizer without its added vocabulary, when first needed)."""

    def __init__(
        self,
        name: str,
        pattern: str,
        ranks: dict[bytes, int],
        norm: Callable[[str], str],
        plain: Callable[[], Any],
    ):
        import tiktoken

        self.enc = tiktoken.Encoding(
            name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
        )
        self.pattern = pattern
        self.ranks = ranks
        self.norm = norm
        self._plain = plain
        #: every id tiktoken can give here (the ranks' ids)
        self.ids = frozenset(ranks.values())
        self.guard = byte_guard([b for b in range(256) if bytes([b]) not in ranks])

    @property
    def plain(self) -> Any:
        return self._plain()

    def _slow(self, text: str) -> bool:
        return self.guard is not None and self.guard.search(text) is not None

    def encode(self, text: str) -> list[int]:
        if self._slow(text):
            return list(self.plain.encode(text, add_special_tokens=False).ids)
        return self.enc.encode_ordinary(self.norm(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.encode_batch_marked(texts)[0]

    def encode_batch_marked(self, texts: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """The ids of ``texts``, and which of them came from ``tokenizers`` (the rest came from
        the ranks, ``ids``: ``Tokenizer.encode_batch`` leaves those unchecked when no rank's id is
        a control id)."""
        slow = [i for i, t in enumerate(texts) if self._slow(t)]
        enc = self.enc.encode_ordinary
        out = encode_threaded(
            lambda t: enc(self.norm(t)),
            texts if not slow else ["" if self._slow(t) else t for t in texts],
        )
        if slow:
            encs = self.plain.encode_batch([texts[i] for i in slow], add_special_tokens=False)
            for i, e in zip(slow, encs, strict=True):
                out[i] = list(e.ids)
        return out, slow


def fast_bpe(
    spec: dict[str, Any],
    sha256: str,
    control: set[int],
    byte_decoder: dict[str, int],
    plain: Any,
) -> tuple[FastBPE | None, str]:
    """The fast encoder for this tokenizer.json, or None; and a line saying which and why."""
    if os.environ.get("DRAFTDATA_FAST_BPE", "1") == "0":
        return None, "tokenizers (DRAFTDATA_FAST_BPE=0)"
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return None, "tokenizers (tiktoken is not installed)"
    cached = _read_verdict(sha256)
    if cached is not None and not cached["fast"]:
        return None, f"tokenizers ({cached['reason']})"
    pattern, why = pattern_of(spec)
    norm, why_norm = normalizer_of(spec)
    if pattern is None or norm is None:
        return _refused(sha256, why or why_norm)
    ranks, why = (
        ranks_of(spec, control, byte_decoder, plain)
        if cached is None
        else (
            _ranks_only(spec, control, byte_decoder),
            "",
        )
    )
    if ranks is None:
        return _refused(sha256, why)
    try:
        fast = FastBPE(f"draftdata-{sha256[:12]}", pattern, ranks, norm, lambda: plain)
    except ValueError as e:  # a pattern tiktoken's regex engine does not take
        return _refused(sha256, f"tiktoken refuses the pattern ({e})")
    why = verify(fast.encode, plain, CORPUS)  # cheap: on every load, whatever the cache says
    if why:
        return _refused(sha256, why)
    if cached is None:
        _write_verdict(sha256, True, "verified")
    return fast, FAST


def _ranks_only(
    spec: dict[str, Any], control: set[int], byte_decoder: dict[str, int]
) -> dict[bytes, int]:
    """The ranks of a file whose checks passed before (its cached verdict): every entry is in
    the byte-level alphabet, so a translation table maps it at C speed."""
    vocab: dict[str, int] = (spec.get("model") or {}).get("vocab") or {}
    table = str.maketrans({c: chr(b) for c, b in byte_decoder.items()})
    return {t.translate(table).encode("latin-1"): i for t, i in vocab.items() if i not in control}


def _refused(sha256: str, reason: str) -> tuple[None, str]:
    log.info("tokenizer %s stays on tokenizers: %s", sha256[:12], reason)
    _write_verdict(sha256, False, reason)
    return None, f"tokenizers ({reason})"


def _verdict_path(sha256: str) -> Path:
    return cache_dir() / f"{sha256}.fast-bpe.json"


def _read_verdict(sha256: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(_verdict_path(sha256).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("checks") != CHECKS_VERSION:
        return None
    return doc


def _write_verdict(sha256: str, fast: bool, reason: str) -> None:
    doc = {"checks": CHECKS_VERSION, "fast": fast, "reason": reason}
    _write_cache(_verdict_path(sha256), json.dumps(doc).encode("utf-8"))


def _write_cache(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary name renamed into place (a reader sees the
    whole file or the one before). A read-only cache is left alone: the work is done again
    next time."""
    with contextlib.suppress(OSError):
        write_bytes(path, data)


# --- the snapshot of a verified file ----------------------------------------------------------
def _stamp() -> dict[str, Any]:
    """What a snapshot was made with: it is read only where all of it is the same."""
    import tiktoken
    import tokenizers

    return {
        "checks": CHECKS_VERSION,
        "snapshot": SNAPSHOT_VERSION,
        "tiktoken": tiktoken.__version__,
        "tokenizers": tokenizers.__version__,
        "python": list(sys.version_info[:2]),
        "marshal": marshal.version,
    }


def _snapshot_path(sha256: str) -> Path:
    return cache_dir() / f"{sha256}.fast-bpe.snapshot"


def write_snapshot(sha256: str, fast: FastBPE, normalizer: Any, facts: dict[str, Any]) -> None:
    """Keep what loading this verified file again needs (``facts``: what the stock tokenizer
    answered about it), for ``read_snapshot``. A cache that cannot be written is left alone."""
    doc = {
        "stamp": _stamp(),
        "sha256": sha256,
        "pattern": fast.pattern,
        "normalizer": normalizer,
        "ranks": fast.ranks,
        **facts,
    }
    try:
        data = marshal.dumps(doc)
    except ValueError:  # a value marshal does not take: no snapshot, the document is read
        return
    _write_cache(_snapshot_path(sha256), data)


def read_snapshot(sha256: str) -> dict[str, Any] | None:
    """The snapshot of the file with this sha256, or None: no fast path asked for or possible,
    no snapshot, one made by other versions, or one that does not read back whole."""
    if os.environ.get("DRAFTDATA_FAST_BPE", "1") == "0":
        return None
    try:
        doc = marshal.loads(_snapshot_path(sha256).read_bytes())
        stamp = _stamp()
    except (OSError, EOFError, ValueError, TypeError, ImportError):
        return None
    if not isinstance(doc, dict) or doc.get("stamp") != stamp or doc.get("sha256") != sha256:
        return None
    if not doc.keys() >= SNAPSHOT_KEYS:
        return None
    verdict = _read_verdict(sha256)
    if verdict is None or not verdict["fast"]:  # a refusal made since is taken as it is
        return None
    return doc


def fast_from_snapshot(doc: dict[str, Any], plain: Callable[[], Any]) -> FastBPE | None:
    """The fast encoder a snapshot describes, or None where it cannot be rebuilt."""
    norm, _ = _normalizer(doc.get("normalizer"))
    try:
        if norm is None:
            return None
        return FastBPE(f"draftdata-{doc['sha256'][:12]}", doc["pattern"], doc["ranks"], norm, plain)
    except (KeyError, TypeError, ValueError):
        return None
