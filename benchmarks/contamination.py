"""Contamination detector (``measure.contamination``): recall on MT-Bench prompts as they appear in
training records, and the share of unrelated ShareGPT prompts it flags.

(a) Every MT-Bench turn (160: 80 questions x 2) is put into a training text three ways and checked
    against ``mt-bench``; a case counts when the turn's own id is flagged:
    - ``verbatim``: the turn as the whole user message;
    - ``wrapped``: words before and after it ("Hi! I have a question for you. ... Please answer
      step by step, thank you.");
    - ``spliced``: appended to a real ShareGPT first user turn (the i-th, cycling), as a user
      pastes a question into a longer message.
    The same three as whole records (``Prompt`` with turn 1, an assistant answer, turn 2) through
    ``check_prompt``.
(b) The first user turn of each of the 1,000 ShareGPT conversations, checked against ``mt-bench``
    and against ``humaneval``: the number flagged at the threshold, the best-score distribution
    (how far the threshold is from the clean prompts), and every flagged one with its match;
    then every user turn of every conversation (``scan``) against both sets at once.

    python benchmarks/contamination.py [--n 8] [--threshold 0.7] [--show 10]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from draftdata.measure.contamination import Detector, EvalSet
from draftdata.records import Message, Prompt
from draftdata.sources import make_prompt, read_prompts

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
PROMPTS = SHARED / "data" / "prompts"
WRAP = ("Hi! I have a question for you. ", "\nPlease answer step by step, thank you.")


def sharegpt() -> list[Prompt]:
    prompts, skipped = read_prompts(PROMPTS / "sharegpt_v3_first1000.json", "sharegpt", "sharegpt")
    print(f"ShareGPT: {len(prompts)} conversations read, skipped {dict(skipped)}")
    return prompts


def first_turns(prompts: list[Prompt]) -> list[tuple[str, str]]:
    """(conversation id, first user turn) of each conversation, in order."""
    out = []
    for p in prompts:
        first = next((m.content for m in p.messages if m.role == "user" and m.content), None)
        if first is not None:
            out.append((str(p.metadata.get("id", p.id)), first))
    return out


def recall(det: Detector, mt: EvalSet, fillers: list[str]) -> None:
    variants: dict[str, Callable[[str, int], str]] = {
        "verbatim": lambda t, i: t,
        "wrapped": lambda t, i: WRAP[0] + t + WRAP[1],
        "spliced": lambda t, i: fillers[i % len(fillers)] + "\n\n" + t,
    }
    print(
        f"(a) MT-Bench turns in training text, against mt-bench (n={det.n}, "
        f"threshold={det.threshold}; {det.short_prompts} turns shorter than n match verbatim only)"
    )
    for name, make in variants.items():
        missed: list[str] = []
        by_turn = {"1": [0, 0], "2": [0, 0]}
        for i, p in enumerate(mt.prompts):
            m = det.check(make(p.text, i))
            ok = m is not None and m.eval_id == p.id
            turn = p.id.rsplit(".", 1)[1]
            by_turn[turn][0] += ok
            by_turn[turn][1] += 1
            if not ok:
                missed.append(p.id)
        flagged = by_turn["1"][0] + by_turn["2"][0]
        print(
            f"  {name:9s} {flagged:3d}/{len(mt.prompts)} flagged as their own id  "
            f"(turn 1: {by_turn['1'][0]}/{by_turn['1'][1]}, "
            f"turn 2: {by_turn['2'][0]}/{by_turn['2'][1]})"
            + (f"; missed: {', '.join(missed)}" if missed else "")
        )
    # whole records: the two turns as user messages of one conversation
    for name, make in variants.items():
        hit = 0
        for q in range(0, len(mt.prompts), 2):
            t1, t2 = mt.prompts[q], mt.prompts[q + 1]
            msgs = (
                Message("user", make(t1.text, q)),
                Message("assistant", "Sure, here is my answer."),
                Message("user", make(t2.text, q + 1)),
            )
            hit += det.check_prompt(make_prompt("train", msgs)) is not None
        print(f"  record/{name:9s} {hit}/{len(mt.prompts) // 2} two-turn records flagged")


def false_positives(det: Detector, turns: list[tuple[str, str]], show: int) -> None:
    name = det.eval_sets[0].name
    t0 = time.perf_counter()
    best = [(cid, text, m) for cid, text in turns if (m := det.best(text)) is not None]
    dt = time.perf_counter() - t0
    flagged = [(cid, text, m) for cid, text, m in best if m.flagged]
    scores = sorted((m.score for _, _, m in best), reverse=True)
    share = len(flagged) / len(turns)
    print(
        f"(b) ShareGPT first user turns against {name} ({len(det)} prompts): "
        f"{len(flagged)}/{len(turns)} flagged = {share:.1%}  ({dt * 1000:.0f} ms)"
    )
    bands = [(1.0, 1.01), (0.7, 1.0), (0.5, 0.7), (0.3, 0.5), (0.0, 0.3)]
    counts = ", ".join(
        f"[{lo:.1f},{min(hi, 1.0):.1f}{']' if hi > 1 else ')'}: {sum(lo <= s < hi for s in scores)}"
        for lo, hi in bands
    )
    print(
        f"    best score of the {len(scores)} that share an n-gram: {counts}; "
        f"{len(turns) - len(scores)} share none"
    )
    for cid, text, m in flagged[:show]:
        snippet = " ".join(text.split())[:110]
        print(
            f"    {cid:10s} -> {m.eval_id:14s} score {m.score:.2f} ({m.found}/{m.total}, "
            f"{m.rule})  {snippet!r}"
        )
    below = sorted((b for b in best if not b[2].flagged), key=lambda b: -b[2].score)[:3]
    for cid, text, m in below:
        snippet = " ".join(text.split())[:110]
        print(
            f"    (highest unflagged) {cid:10s} -> {m.eval_id:14s} score {m.score:.2f} "
            f"({m.found}/{m.total})  {snippet!r}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--threshold", type=float, default=0.7)
    ap.add_argument("--show", type=int, default=10, help="flagged prompts listed per set")
    args = ap.parse_args()
    t0 = time.perf_counter()
    mt = EvalSet.builtin("mt-bench", SHARED)
    he = EvalSet.builtin("humaneval", SHARED)
    det_mt = Detector([mt], n=args.n, threshold=args.threshold)
    det_he = Detector([he], n=args.n, threshold=args.threshold)
    conversations = sharegpt()
    turns = first_turns(conversations)
    print(
        f"loaded {len(mt.prompts)} mt-bench turns, {len(he.prompts)} humaneval prompts, "
        f"{len(turns)} ShareGPT first turns, indexed in {time.perf_counter() - t0:.2f} s "
        f"({len(det_mt.index)} + {len(det_he.index)} n-grams)"
    )
    recall(det_mt, mt, [t for _, t in turns])
    false_positives(det_mt, turns, args.show)
    false_positives(det_he, turns, args.show)
    both = Detector([mt, he], n=args.n, threshold=args.threshold)
    t0 = time.perf_counter()
    hits = list(both.scan(conversations))
    dt = time.perf_counter() - t0
    n_user = sum(m.role == "user" for p in conversations for m in p.messages)
    print(
        f"(b') every user turn of the {len(conversations)} conversations ({n_user} turns) "
        f"against mt-bench + humaneval: {len(hits)} conversations flagged ({dt * 1000:.0f} ms)"
    )
    for p, m in hits[: args.show]:
        print(f"    {p.metadata.get('id', p.id)} -> {m.eval_set} {m.eval_id} score {m.score:.2f}")


if __name__ == "__main__":
    main()
