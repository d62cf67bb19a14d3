"""Learned split preferences: where a model does not emit the canonical BPE split of its text.

A preference says: where canonical encoding yields the ids ``C`` between a left and a right
context, the model emits ``E`` instead (same bytes). Contexts are character classes of the
neighbouring tokens (digit, letter, space, newline, punctuation, other, edge). They are learned
from ground-truth records (exact ``output_ids``) and kept only when they do not lower exact-match
on records held out from learning.

SmolLM2's example: its training tokenizer split digits off before the byte-level regex, so it
writes ``"\\n\\n"`` as one token (1116) before a list number, where the GGUF tokenizer's canonical
split is two (198 198).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import write_text
from ..nesting import loads_json
from ..tokenizers import Tokenizer
from ..version import __version__

EDGE = "e"
FORMAT_VERSION = 1


def char_class(ch: str) -> str:
    if ch == "":
        return EDGE
    if ch.isdigit():
        return "d"
    if ch in "\r\n":
        return "n"
    if ch.isspace():
        return "s"
    if ch.isalpha():
        return "l"
    if ch.isascii():
        return "p"
    return "o"


@dataclass(frozen=True)
class SplitRule:
    canonical: tuple[int, ...]
    model: tuple[int, ...]
    before: str | None  # class of the previous token's last char, None = any
    after: str | None  # class of the next token's first char, None = any
    support: int = 0  # learning occurrences where the model wrote ``model`` (from >= 2 prompts)
    against: int = 0  # learning occurrences where it wrote ``canonical``

    def key(self) -> tuple[Any, ...]:
        return (self.canonical, self.before, self.after)


@dataclass
class SplitPrefs:
    tokenizer_sha256: str
    rules: list[SplitRule] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    # --- persistence ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "draftdata.split_prefs",
            "version": FORMAT_VERSION,
            "draftdata_version": __version__,
            "tokenizer_sha256": self.tokenizer_sha256,
            "stats": self.stats,
            "rules": [
                {**asdict(r), "canonical": list(r.canonical), "model": list(r.model)}
                for r in self.rules
            ],
        }

    def save(self, path: Path) -> None:
        """Written under a temporary name, then renamed: a kill never leaves half a file."""
        write_text(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> SplitPrefs:
        try:
            doc = loads_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise InputError(
                f"{path}: cannot read split preferences ({e}); make them with `draftdata learn`"
            ) from e
        if doc.get("kind") != "draftdata.split_prefs":
            raise InputError(f"{path}: not a split-preferences file from `draftdata learn`")
        rules = [
            SplitRule(
                tuple(r["canonical"]),
                tuple(r["model"]),
                r["before"],
                r["after"],
                r.get("support", 0),
                r.get("against", 0),
            )
            for r in doc["rules"]
        ]
        return cls(doc["tokenizer_sha256"], rules, doc.get("stats", {}))

    def check_tokenizer(self, tok: Tokenizer, path: Path | str = "prefs") -> None:
        if tok.sha256 != self.tokenizer_sha256:
            raise InputError(
                f"{path}: learned for tokenizer sha256 {self.tokenizer_sha256[:12]}…, but this "
                f"tokenizer is {tok.sha256[:12]}…; learn preferences for this tokenizer"
            )

    # --- application ---------------------------------------------------------------------
    def applier(self, tok: Tokenizer) -> Callable[[str, list[int]], list[int]]:
        return Applier(self.rules, tok)


class Applier:
    """Rewrites canonical ids with the learned splits, left to right, longest rule first."""

    def __init__(self, rules: Sequence[SplitRule], tok: Tokenizer) -> None:
        self.tok = tok
        self.by_first: dict[int, list[SplitRule]] = defaultdict(list)
        for r in sorted(
            rules, key=lambda r: (-len(r.canonical), r.before is None, r.after is None)
        ):
            self.by_first[r.canonical[0]].append(r)
        self._first: dict[int, str] = {}
        self._last: dict[int, str] = {}

    def _cls(self, tid: int | None, last: bool) -> str:
        if tid is None or tid in self.tok.control_ids:
            return EDGE
        cache = self._last if last else self._first
        c = cache.get(tid)
        if c is None:
            text = self.tok.token_bytes(tid).decode("utf-8", errors="ignore")
            c = char_class(text[-1:] if last else text[:1])
            cache[tid] = c
        return c

    def __call__(self, text: str, ids: list[int]) -> list[int]:
        if not self.by_first:
            return ids
        out: list[int] = []
        i, n = 0, len(ids)
        while i < n:
            for r in self.by_first.get(ids[i], ()):
                k = len(r.canonical)
                if tuple(ids[i : i + k]) != r.canonical:
                    continue
                if r.before is not None and self._cls(ids[i - 1] if i else None, True) != r.before:
                    continue
                if (
                    r.after is not None
                    and self._cls(ids[i + k] if i + k < n else None, False) != r.after
                ):
                    continue
                out.extend(r.model)
                i += k
                break
            else:
                out.append(ids[i])
                i += 1
        return out


# --- learning ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pair:
    """One ground-truth record for learning: the canonical ids and the model's ids of the same
    response text."""

    group: str
    canonical: list[int]
    truth: list[int]


def _offsets(tok: Tokenizer, ids: Sequence[int]) -> list[int]:
    pos = [0]
    for t in ids:
        pos.append(pos[-1] + len(tok.token_bytes(t)))
    return pos


def diff_blocks(
    tok: Tokenizer, a: Sequence[int], b: Sequence[int]
) -> list[tuple[int, int, int, int]] | None:
    """Blocks ``(i0, i1, j0, j1)`` where ``a[i0:i1]`` and ``b[j0:j1]`` cover the same bytes with a
    different split. None when the two do not spell the same bytes."""
    oa, ob = _offsets(tok, a), _offsets(tok, b)
    if oa[-1] != ob[-1] or b"".join(tok.token_bytes(t) for t in a) != b"".join(
        tok.token_bytes(t) for t in b
    ):
        return None
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            i += 1
            j += 1
            continue
        i0, j0 = i, j
        i += 1
        j += 1
        while oa[i] != ob[j]:
            if oa[i] < ob[j]:
                i += 1
            else:
                j += 1
        out.append((i0, i, j0, j))
    return out


#: a candidate preference: (canonical ids, the model's ids, class before, class after)
Candidate = tuple[Any, ...]
#: how a learned set of rules is scored on the held-out records (exact-match count)
Scorer = Callable[[Sequence[Pair], Callable[[str, list[int]], list[int]]], int]


def learn(
    tok: Tokenizer,
    pairs: Sequence[Pair],
    *,
    holdout: float = 0.25,
    min_support: int = 3,
    evaluate: Scorer | None = None,
) -> SplitPrefs:
    """Learn preferences on part of ``pairs`` and keep each only if exact-match on the held-out
    part does not drop. Pairs are split by ``group`` (one prompt's samples stay together)."""
    learn_set = [p for p in pairs if bucket_of("holdout:" + p.group) >= holdout]
    held = [p for p in pairs if bucket_of("holdout:" + p.group) < holdout]
    cls = Applier([], tok)

    # 1. candidates from the differing blocks, at three levels of context
    cands = _candidates(tok, cls, learn_set)

    # 2. count, for each candidate, where canonical C occurs in that context: model wrote E
    #    (support) or C (against)
    by_c: dict[tuple[int, ...], list[Candidate]] = defaultdict(list)
    for key, n in cands.items():
        if n >= min_support:
            by_c[key[0]].append(key)
    counts, groups = _tally(tok, cls, learn_set, by_c)
    rules = _best_rules(counts, groups, min_support)

    # 3. the held-out check: a rule that lowers exact-match there is never kept
    score = evaluate or _exact_count
    base = score(held, Applier([], tok))
    kept, rejected, current = _held_out_check(tok, held, rules, score, base)
    prefs = SplitPrefs(tok.sha256, kept)
    prefs.stats = {
        "records": len(pairs),
        "learn_records": len(learn_set),
        "held_out_records": len(held),
        "candidates": len(rules),
        "held_out_exact_before": base,
        "held_out_exact_after": current,
        "rejected_by_held_out": rejected,
    }
    return prefs


def _candidates(tok: Tokenizer, cls: Applier, learn_set: Sequence[Pair]) -> Counter[Candidate]:
    """Every block where the model's split differs from the canonical one, counted with no
    context, with each side's class alone and with both."""
    cands: Counter[Candidate] = Counter()
    for p in learn_set:
        blocks = diff_blocks(tok, p.canonical, p.truth)
        if not blocks:
            continue
        for i0, i1, j0, j1 in blocks:
            c, e = tuple(p.canonical[i0:i1]), tuple(p.truth[j0:j1])
            before = cls._cls(p.canonical[i0 - 1] if i0 else None, True)
            after = cls._cls(p.canonical[i1] if i1 < len(p.canonical) else None, False)
            for b_ctx, a_ctx in ((None, None), (None, after), (before, None), (before, after)):
                cands[(c, e, b_ctx, a_ctx)] += 1
    return cands


def _tally(
    tok: Tokenizer,
    cls: Applier,
    learn_set: Sequence[Pair],
    by_c: Mapping[tuple[int, ...], list[Candidate]],
) -> tuple[dict[Candidate, list[int]], dict[Candidate, set[str]]]:
    """For each candidate, [support, against] over every place its canonical ids occur in its
    context with a token boundary of the model's on both sides, and the groups (prompts) that
    gave the support."""
    counts: dict[Candidate, list[int]] = {k: [0, 0] for ks in by_c.values() for k in ks}
    groups: dict[Candidate, set[str]] = defaultdict(set)
    for p in learn_set:
        ob = set(_offsets(tok, p.truth))
        oa = _offsets(tok, p.canonical)
        tpos = {o: j for j, o in enumerate(_offsets(tok, p.truth))}
        for c, keys in by_c.items():
            k = len(c)
            for i in range(len(p.canonical) - k + 1):
                if p.canonical[i] != c[0] or tuple(p.canonical[i : i + k]) != c:
                    continue
                start, end = oa[i], oa[i + k]
                if start not in ob or end not in ob:
                    continue
                written = tuple(p.truth[tpos[start] : tpos[end]])
                before = cls._cls(p.canonical[i - 1] if i else None, True)
                after = cls._cls(p.canonical[i + k] if i + k < len(p.canonical) else None, False)
                for key in keys:
                    if (key[2] is None or key[2] == before) and (key[3] is None or key[3] == after):
                        if written == key[1]:
                            counts[key][0] += 1
                            groups[key].add(p.group)
                        elif written == c:
                            counts[key][1] += 1
    return counts, groups


def _best_rules(
    counts: Mapping[Candidate, list[int]], groups: Mapping[Candidate, set[str]], min_support: int
) -> list[SplitRule]:
    """The winning rule for each (canonical, model) split, largest net gain first."""
    best: dict[Candidate, SplitRule] = {}
    for key, (sup, against) in counts.items():
        # support must come from several prompts: one repetitive answer proves nothing
        if len(groups[key]) < min_support or sup <= against:
            continue
        rule = SplitRule(key[0], key[1], key[2], key[3], sup, against)
        # prefer the most general context that still wins; then the larger net gain
        slot = (key[0], key[1])
        cur = best.get(slot)
        gen = (rule.before is None) + (rule.after is None)
        if cur is None or (gen, sup - against) > (
            (cur.before is None) + (cur.after is None),
            cur.support - cur.against,
        ):
            best[slot] = rule
    return sorted(best.values(), key=lambda r: r.support - r.against, reverse=True)


def _held_out_check(
    tok: Tokenizer, held: Sequence[Pair], rules: Sequence[SplitRule], score: Scorer, base: int
) -> tuple[list[SplitRule], list[dict[str, Any]], int]:
    """The rules kept (each added only where the held-out score does not drop), the ones
    rejected with what they cost, and the held-out score with the kept ones."""
    kept: list[SplitRule] = []
    rejected: list[dict[str, Any]] = []
    current = base
    for r in rules:
        trial = score(held, Applier([*kept, r], tok))
        if trial >= current:
            kept.append(r)
            current = trial
        else:
            rejected.append(
                {
                    "canonical": list(r.canonical),
                    "model": list(r.model),
                    "held_out_exact_delta": trial - current,
                }
            )
    return kept, rejected, current


def _exact_count(pairs: Iterable[Pair], apply: Callable[[str, list[int]], list[int]]) -> int:
    return sum(apply("", p.canonical) == p.truth for p in pairs)


def bucket_of(group: str) -> float:
    """Where ``group`` (a prompt's id) falls in [0, 1]: a deterministic split that keeps one
    prompt's samples together."""
    return int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


#: the old private name, still imported by pipeline.py
_bucket = bucket_of


def in_bucket(group: str, lo: float, hi: float) -> bool:
    """Whether ``group`` falls in [lo, hi); a bucket that ends at 1 takes 1 too."""
    b = bucket_of(group)
    return lo <= b < hi or (hi == 1 and b == 1)


def applier_for(path: Path | None, tok: Tokenizer) -> Callable[[str, list[int]], list[int]] | None:
    """The split preferences saved at ``path`` as a ``text_ids`` rewrite for ``tok``, checked
    to have been learned for it; None without a path."""
    if path is None:
        return None
    prefs = SplitPrefs.load(path)
    prefs.check_tokenizer(tok, path)
    return prefs.applier(tok)
