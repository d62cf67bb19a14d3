"""Contamination of training prompts by evaluation prompts (MT-Bench, HumanEval, your own set).

A drafter is judged by its acceptance on MT-Bench, HumanEval and GSM8K; a training set that holds
those prompts inflates the figure. This module says, for each training text, which evaluation
prompt it contains, if any.

The rule (PaLM's, Chowdhery et al. 2022, section 8: an evaluation example is contaminated when at
least 70% of its 8-grams occur in the training data):

- **Normalize** both sides the same way: NFKC, casefold, every run of characters that is not a
  letter or digit becomes one space (punctuation, underscores and line breaks included), so
  ``has_close_elements(numbers: List[float])`` reads ``has close elements numbers list float``.
- **Word n-grams**, ``n = 8`` by default (GPT-3 used 13 over whole documents; prompts are short:
  66 of MT-Bench's 160 turns have fewer than 13 words, only 7 fewer than 8).
- **Score** = the share of the *evaluation prompt's* distinct n-grams found in the training text.
  The evaluation side is the right denominator because the question is "does this record contain
  that prompt?": a record that embeds an MT-Bench question in a long conversation holds all of
  the question's n-grams but only a small share of its own, so the training side's share would
  miss exactly the contamination that matters, and would depend on how long the record is.
- **Flag** when the score reaches ``threshold`` (0.7 by default, PaLM's figure). A verbatim or
  embedded copy scores 1.0; light edits (a word changed in every 8th position) still pass.
- **Short evaluation prompts** (fewer than ``n`` words, e.g. MT-Bench's "Prove the Pythagorean
  theorem.") have no n-gram; they match only a training text whose whole normalized text equals
  theirs (score 1.0, rule ``exact``). Matching them inside longer text would flag generic
  follow-ups ("Can you parallelize it?") wherever they occur.

Memory is bounded by the evaluation side: the index maps each evaluation n-gram to the prompts
that hold it; a training text is streamed through it and nothing of it is kept. Text without
spaces between words (Chinese, Japanese) reads as few long "words", so it matches only verbatim.

Built-in sets (``BUILTIN_SETS``) are read from the shared prompt files
(``shared/data/prompts``): ``mt-bench`` (every turn of the 80 questions, ids ``81.1``, ``81.2``)
and ``humaneval`` (the task ``prompt`` field, without the instruction the reader adds; ids are
task ids). Any other set, GSM8K included, is a JSONL file (``EvalSet.from_jsonl``).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import InputError
from ..records import Prompt
from ..records.meta import Contamination, FlaggedPrompt
from ..records.wire import messages_of
from ..sources import iter_json_records, read_prompts

__all__ = [
    "BUILTIN_SETS",
    "DEFAULT_N",
    "DEFAULT_THRESHOLD",
    "Detector",
    "EvalPrompt",
    "EvalSet",
    "Match",
    "Tally",
    "default_shared_dir",
    "detector_for",
    "load_eval_set",
    "normalize",
    "words",
]

#: word n-gram length (PaLM's 8; see the module docstring)
DEFAULT_N = 8
#: share of an evaluation prompt's n-grams a training text must hold to be flagged (PaLM's 70%)
DEFAULT_THRESHOLD = 0.7
#: the evaluation sets ``EvalSet.builtin`` reads, and their files under ``shared/data/prompts``
BUILTIN_FILES = {"mt-bench": "mt_bench_question.jsonl", "humaneval": "HumanEval.jsonl.gz"}
BUILTIN_SETS: tuple[str, ...] = tuple(BUILTIN_FILES)
#: the fields of a user JSONL record read as its prompt, in this order (GSM8K's is ``question``)
TEXT_FIELDS = ("prompt", "text", "question")

_WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """``text`` normalized (NFKC, casefolded) as its words: the runs of letters and digits."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def normalize(text: str) -> str:
    """``text`` as the detector compares it: its words joined by single spaces."""
    return " ".join(words(text))


def _ngrams(ws: Sequence[str], n: int) -> Iterator[str]:
    for i in range(len(ws) - n + 1):
        yield " ".join(ws[i : i + n])


def default_shared_dir() -> Path:
    """The shared data folder: ``$DRAFTDATA_SHARED``, else ``shared/`` beside the repository
    checkout (where the tests find it; an installed package has no other way to know it)."""
    env = os.environ.get("DRAFTDATA_SHARED")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[3].parent / "shared"


# --- evaluation sets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalPrompt:
    """One evaluation prompt: its id within the set and its text."""

    id: str
    text: str


@dataclass(frozen=True)
class EvalSet:
    """A named list of evaluation prompts; ``skipped`` counts the records that gave none."""

    name: str
    prompts: tuple[EvalPrompt, ...]
    skipped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise InputError(f"evaluation set {self.name!r} holds no prompts; check its file")

    @classmethod
    def builtin(cls, name: str, shared_dir: Path | str | None = None) -> EvalSet:
        """The built-in set ``name`` (one of ``BUILTIN_SETS``) read from
        ``shared_dir/data/prompts`` (``default_shared_dir()`` when not given)."""
        file = BUILTIN_FILES.get(name)
        if file is None:
            raise InputError(
                f"unknown evaluation set {name!r}; choose one of {', '.join(BUILTIN_SETS)} "
                "or pass a JSONL file of prompts"
            )
        base = Path(shared_dir) if shared_dir is not None else default_shared_dir()
        path = base / "data" / "prompts" / file
        if not path.is_file():
            raise InputError(
                f"{path}: the {name} prompts are not there; check out shared/ beside the "
                "repository, set DRAFTDATA_SHARED, or pass shared_dir"
            )
        if name == "mt-bench":
            return cls.mtbench(path)
        return cls.humaneval(path)

    @classmethod
    def mtbench(cls, path: Path | str, name: str = "mt-bench") -> EvalSet:
        """Every turn of a FastChat MT-Bench question file, ids ``QUESTION.TURN``."""
        prompts, skipped = read_prompts(Path(path), "mtbench", name)
        out = [
            EvalPrompt(f"{p.metadata.get('question_id', p.id)}.{i}", m.content or "")
            for p in prompts
            for i, m in enumerate(p.messages, 1)
        ]
        return cls(name, tuple(out), dict(skipped))

    @classmethod
    def humaneval(cls, path: Path | str, name: str = "humaneval") -> EvalSet:
        """The ``prompt`` field of each HumanEval task (no instruction added), ids task ids."""
        prompts, skipped = read_prompts(Path(path), "humaneval", name, {"instruction": ""})
        out = [
            EvalPrompt(str(p.metadata.get("task_id", p.id)), p.messages[0].content or "")
            for p in prompts
        ]
        return cls(name, tuple(out), dict(skipped))

    @classmethod
    def from_jsonl(cls, path: Path | str, name: str | None = None) -> EvalSet:
        """A user's set: one JSON object per line (a JSON array file too) with a text field
        (``prompt``, ``text`` or ``question``, the first present) or OpenAI ``messages``, whose
        user turns are each a prompt. Ids are the record's ``id`` or ``question_id`` (else its
        number among the readable records, from 1), with ``.TURN`` for messages. Records with
        neither, and prompts with no letter or digit, are skipped and counted."""
        path = Path(path)
        skipped: Counter[str] = Counter()
        out: list[EvalPrompt] = []
        for i, rec in enumerate(iter_json_records(path, skipped), 1):
            rid = str(rec.get("id", rec.get("question_id", i)))
            text = next((rec[k] for k in TEXT_FIELDS if isinstance(rec.get(k), str)), None)
            if text is not None:
                if words(text):
                    out.append(EvalPrompt(rid, text))
                else:
                    skipped["empty_prompt"] += 1
                continue
            raw = rec.get("messages")
            if not isinstance(raw, list):
                skipped["no_prompt_text_or_messages"] += 1
                continue
            try:
                msgs = messages_of(raw)
            except InputError:
                skipped["bad_message"] += 1
                continue
            turns = [m.content for m in msgs if m.role == "user" and m.content and words(m.content)]
            if not turns:
                skipped["no_user_turn"] += 1
            out.extend(EvalPrompt(f"{rid}.{t}", c) for t, c in enumerate(turns, 1))
        return cls(name or path.name.split(".")[0], tuple(out), dict(skipped))


# --- the detector ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """The evaluation prompt a text overlaps most. ``score`` is the share of that prompt's
    distinct n-grams found in the text (``found`` of ``total``); rule ``exact`` is a prompt
    shorter than n words whose normalized text equals the text's (score 1.0)."""

    eval_set: str
    eval_id: str
    score: float
    found: int
    total: int
    rule: Literal["ngram", "exact"]
    flagged: bool


class Detector:
    """An index of the evaluation sets' n-grams; ``check`` a training text against it.

    ``n`` is the word n-gram length and ``threshold`` the share of an evaluation prompt's n-grams
    that flags a text (see the module docstring for why these and why the evaluation side)."""

    def __init__(
        self,
        eval_sets: Iterable[EvalSet],
        n: int = DEFAULT_N,
        threshold: float = DEFAULT_THRESHOLD,
    ) -> None:
        if not isinstance(n, int) or n < 1:
            raise InputError(f"n-gram length {n!r} must be a positive integer (8 is the default)")
        if not 0.0 < threshold <= 1.0:
            raise InputError(f"threshold {threshold!r} must be in (0, 1] (0.7 is the default)")
        self.n = n
        self.threshold = threshold
        self.eval_sets = tuple(eval_sets)
        if not self.eval_sets:
            raise InputError("no evaluation sets to check against; pass at least one")
        #: (set name, prompt id) of every indexed prompt, by its index
        self.keys: list[tuple[str, str]] = []
        #: distinct n-grams of each indexed prompt (0 for a short prompt)
        self.totals: list[int] = []
        self.index: dict[str, list[int]] = {}
        self.exact: dict[str, list[int]] = {}
        for es in self.eval_sets:
            for p in es.prompts:
                k = len(self.keys)
                self.keys.append((es.name, p.id))
                ws = words(p.text)
                grams = set(_ngrams(ws, n))
                self.totals.append(len(grams))
                for g in grams:
                    self.index.setdefault(g, []).append(k)
                if not grams and ws:
                    self.exact.setdefault(" ".join(ws), []).append(k)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def short_prompts(self) -> int:
        """How many evaluation prompts have fewer than ``n`` words (matched only verbatim)."""
        return sum(len(ks) for ks in self.exact.values())

    def best(self, text: str) -> Match | None:
        """The evaluation prompt ``text`` overlaps most, flagged or not; None when it shares no
        n-gram with any (ties: the prompt with more n-grams, then the earlier one)."""
        ws = words(text)
        if not ws:
            return None
        if len(ws) < self.n:  # no n-gram: only a short evaluation prompt can match, verbatim
            ks = self.exact.get(" ".join(ws))
            return self._match(ks[0], 0, "exact") if ks else None
        hits: Counter[int] = Counter()
        seen: set[str] = set()
        for g in _ngrams(ws, self.n):
            ks = self.index.get(g)
            if ks is None or g in seen:
                continue
            seen.add(g)
            hits.update(ks)
        if not hits:
            return None
        k, found = max(
            hits.items(), key=lambda kv: (kv[1] / self.totals[kv[0]], self.totals[kv[0]], -kv[0])
        )
        return self._match(k, found, "ngram")

    def _match(self, k: int, found: int, rule: Literal["ngram", "exact"]) -> Match:
        name, pid = self.keys[k]
        if rule == "exact":
            return Match(name, pid, 1.0, 0, 0, rule, True)
        total = self.totals[k]
        score = found / total
        return Match(name, pid, score, found, total, rule, score >= self.threshold)

    def check(self, text: str) -> Match | None:
        """The match that flags ``text`` as contaminated, or None when it is clean."""
        m = self.best(text)
        return m if m is not None and m.flagged else None

    def check_prompt(self, prompt: Prompt) -> Match | None:
        """``check`` over the prompt's user and system messages, each on its own (evaluation
        prompts are single turns); the best flagged match, or None."""
        found = [
            m
            for msg in prompt.messages
            if msg.role in ("user", "system") and msg.content
            for m in [self.check(msg.content)]
            if m is not None
        ]
        return max(found, key=lambda m: (m.score, m.total), default=None)

    def scan(self, prompts: Iterable[Prompt]) -> Iterator[tuple[Prompt, Match]]:
        """The flagged prompts of a stream, each with its match; nothing else is kept."""
        for p in prompts:
            m = self.check_prompt(p)
            if m is not None:
                yield p, m


# --- sets by name, and a dataset's tally ---------------------------------------------------------

#: matches a dataset's tally keeps (the first ones, in reading order) for the report and the CLI
FIRST_MATCHES = 10


def load_eval_set(spec: str, base: Path | None = None, shared_dir: Path | None = None) -> EvalSet:
    """The evaluation set ``spec`` names: a built-in set (``BUILTIN_SETS``) or a JSONL file
    (relative to ``base`` where given: a manifest's folder)."""
    if spec in BUILTIN_FILES:
        return EvalSet.builtin(spec, shared_dir)
    path = Path(spec).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise InputError(
            f"evaluation set {spec!r}: not a built-in set ({', '.join(BUILTIN_SETS)}) and "
            f"{path} is not a file; name a built-in set or a JSONL file of prompts"
        )
    return EvalSet.from_jsonl(path)


def detector_for(specs: Sequence[str], base: Path | None = None) -> Detector:
    """One detector over the sets ``specs`` names (``load_eval_set`` each)."""
    return Detector([load_eval_set(s, base) for s in specs])


@dataclass
class Tally:
    """One dataset's contamination: prompts checked, prompts flagged by evaluation set, and the
    first ``FIRST_MATCHES`` flagged prompts with their match."""

    checked: int = 0
    flagged: Counter[str] = field(default_factory=Counter)
    first: list[tuple[str, Match]] = field(default_factory=list)
    keep: int = FIRST_MATCHES

    @property
    def total(self) -> int:
        return sum(self.flagged.values())

    def add(self, prompt_id: str, m: Match | None) -> None:
        self.checked += 1
        if m is None:
            return
        self.flagged[m.eval_set] += 1
        if len(self.first) < self.keep:
            self.first.append((prompt_id, m))

    def record(self) -> Contamination:
        """The tally as the ledger keeps it (``store.meta.CONTAMINATION``) and ``draftdata
        contamination --json`` prints it."""
        return Contamination(
            self.checked,
            self.total,
            dict(self.flagged),
            tuple(
                FlaggedPrompt(pid, m.eval_set, m.eval_id, round(m.score, 4), m.rule)
                for pid, m in self.first
            ),
        )

    @classmethod
    def of_record(cls, c: Contamination) -> Tally:
        """A tally back from its record (a match's n-gram counts are not kept: 0)."""
        t = cls(checked=c.checked)
        t.flagged.update(c.by_set)
        for f in c.first:
            t.first.append((f.prompt_id, Match(f.eval_set, f.eval_id, f.score, 0, 0, f.rule, True)))
        return t
