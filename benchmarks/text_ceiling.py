"""How far text alone can go on a model's ground truth, and why not further (issue 55).

Cross-validated as `draftdata learn` and `validate --prefs` are: split preferences are learned
on one half of the prompts (by `--bucket`'s hash) and the other half is reconstructed from its
text with them, both ways. Every answer the text gets wrong is then sorted by what it would
take to get it right from text:

- ``bytes_lost``: the model wrote byte pieces that are no valid UTF-8 on their own; the text a
  server returns holds U+FFFD in their place, which no rule can turn back into the bytes;
- ``split_seen_once``: the model wrote a span in other pieces than its tokenizer's own encoding,
  and no other prompt's answer shows that split: no rule learned from other answers can
  predict it (`learn` keeps a split seen in at least ``--min-support`` prompts);
- ``split_both_ways``: the model's own answers (this one included, elsewhere in it) write
  the same span the canonical way: a text rule that took this split would break those;
- ``split_repeated``: a split seen in ``--min-support`` prompts or more and never the canonical
  way elsewhere: what a better learner could still win from text;
- ``other``: anything else (none on SmolLM2's dev file).

The ceiling printed is the exact answers plus ``split_repeated``: what text alone could reach
with every repeatable rule known. It also learns with lower ``--min-support`` values to show
that rules from fewer sightings lower the cross-validated figure.

    .venv/bin/python benchmarks/text_ceiling.py                 # SmolLM2's dev ground truth
    .venv/bin/python benchmarks/text_ceiling.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
HALVES = ((0.0, 0.5), (0.5, 1.0))
REPLACEMENT = "\ufffd"


def _has(seq: Sequence[int], ng: Sequence[int]) -> bool:
    n = len(ng)
    first = ng[0]
    return any(
        seq[i] == first and list(seq[i : i + n]) == list(ng) for i in range(len(seq) - n + 1)
    )


def divergence(tok: Any, truth: list[int], ours: list[int]) -> tuple[list[int], list[int]]:
    """The first differing span: the model's ids and ours, up to where both decode to the same
    text and agree again."""
    i = 0
    while i < min(len(truth), len(ours)) and truth[i] == ours[i]:
        i += 1
    for a in range(i + 1, min(i + 16, len(truth)) + 1):
        for b in range(i + 1, min(i + 16, len(ours)) + 1):
            same = tok.decode(truth[i:a]) == tok.decode(ours[i:b])
            if same and truth[a : a + 2] == ours[b : b + 2]:
                return truth[i:a], ours[i:b]
    return truth[i : i + 4], ours[i : i + 4]


def cross_validated(bound: Any, pairs: list[Any], min_support: int) -> list[tuple[Any, list[int]]]:
    """Each pair with the ids text alone gives it, preferences learned on the other half."""
    from draftdata.tokens.prefs import in_bucket, learn

    out = []
    for lo, hi in HALVES:
        this = [p for p in pairs if in_bucket(p.group, lo, hi)]
        other = [p for p in pairs if not in_bucket(p.group, lo, hi)]
        apply = learn(bound.tokenizer, other, min_support=min_support).applier(bound.tokenizer)
        out += [(p, apply("", list(p.canonical))) for p in this]
    return out


def sort_misses(
    tok: Any, made: list[tuple[Any, list[int]]], min_support: int
) -> tuple[Counter[str], list[dict[str, Any]]]:
    """Each wrong answer's kind (see the module's docstring), with its span."""
    kinds: Counter[str] = Counter()
    rows = []
    for p, ours in made:
        if ours == p.truth:
            continue
        t, o = divergence(tok, p.truth, ours)
        text = tok.decode(t)
        elsewhere = [q for q, _ in made if q is not p]
        if REPLACEMENT in text or REPLACEMENT in tok.decode(o):
            kind = "bytes_lost"
        elif any(_has(q.truth, o) for q, _ in made):  # its own answer included
            kind = "split_both_ways"
        elif 1 + len({q.group for q in elsewhere if _has(q.truth, t)} - {p.group}) < min_support:
            kind = "split_seen_once"
        else:
            kind = "split_repeated"
        kinds[kind] += 1
        rows.append({"group": p.group, "kind": kind, "text": text, "model": t, "ours": o})
    return kinds, rows


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ground-truth", type=Path, default=GT)
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "smollm2"))
    ap.add_argument("--format", default="chatml")
    ap.add_argument("--min-support", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from draftdata.measure.validate import learning_pairs
    from draftdata.sources import read_ground_truth
    from draftdata.tokens.target import load_target

    target = load_target(args.tokenizer, args.format, strict=False)
    bound = target.bound
    skipped: Counter[str] = Counter()
    records = read_ground_truth(args.ground_truth, skipped)
    pairs, drops = learning_pairs(target, records)
    if not pairs:
        sys.exit(f"{args.ground_truth}: no usable ground-truth records (drops: {dict(drops)})")
    made = cross_validated(bound, pairs, args.min_support)
    exact = sum(ours == p.truth for p, ours in made)
    kinds, rows = sort_misses(bound.tokenizer, made, args.min_support)
    n = len(made)
    ceiling = exact + kinds["split_repeated"]
    lower = {}
    for ms in range(1, args.min_support):
        lower[ms] = sum(o == p.truth for p, o in cross_validated(bound, pairs, ms))
    print(f"{args.ground_truth.name}: {n} answers, text alone cross-validated")
    print(f"  exact {exact} of {n} ({exact / n:.3f}), --min-support {args.min_support}")
    for ms, k in lower.items():
        print(f"  exact {k} of {n} ({k / n:.3f}) with rules from {ms} prompt(s)")
    for kind, k in kinds.most_common():
        print(f"  wrong, {kind}: {k}")
    print(
        f"  ceiling from text (every repeatable split known): {ceiling} of {n} ({ceiling / n:.3f})"
    )
    for r in rows:
        print(
            f"    {r['kind']:16} {r['group']:28} {r['text']!r}: model {r['model']} ours {r['ours']}"
        )
    if args.json:
        out = {
            "n": n,
            "exact": exact,
            "min_support": args.min_support,
            "exact_with_min_support": lower,
            "wrong": dict(kinds),
            "ceiling": ceiling,
            "misses": rows,
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
