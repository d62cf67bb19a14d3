"""How often each quality check (draftdata.tokens.quality) fires on the SmolLM2 dev ground truth,
per source, with 3 examples each (id and the answer's last 80 characters).

    .venv/bin/python benchmarks/quality_checks.py [GROUNDTRUTH.jsonl] [TOKENIZER]

The answer text is decoded from the exact output ids with the SmolLM2 tokenizer (the stop id
left out), as the tokens stage would. ``language_mismatch`` runs only where py3langid is
importable (it is not a draftdata dependency); its rule here: py3langid's normalised
probability >= 0.9 for both the last user message and the answer, and the two languages differ.
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from draftdata.formats import get_format
from draftdata.records import GroundTruth
from draftdata.sources import read_ground_truth
from draftdata.tokenizers import load_tokenizer
from draftdata.tokens.quality import (
    QUALITY_CHECKS,
    AnswerIndex,
    Markers,
    check_answer,
    language_mismatch,
)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
TOK = SHARED / "tokenizers" / "smollm2"


def detector() -> Callable[[str], str | None] | None:
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier  # type: ignore[import-not-found]
    except ImportError:
        return None
    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)

    def detect(text: str) -> str | None:
        lang, p = ident.classify(text)
        return str(lang) if p >= 0.9 else None

    return detect


def prompt_of(g: GroundTruth) -> str:
    """The prompt's identity for duplicates: the record id less its decoding."""
    return re.sub(r"-(greedy|sample)$", "", g.id)


def main() -> None:
    gt = Path(sys.argv[1]) if len(sys.argv) > 1 else GT
    tok = load_tokenizer(sys.argv[2] if len(sys.argv) > 2 else str(TOK))
    records = read_ground_truth(gt, Counter())
    bound = get_format("chatml").bind(tok)
    markers = Markers(bound.stop_ids, bound.ids.get("think_open"), bound.ids.get("think_close"))
    stop = markers.stop
    detect = detector()
    index = AnswerIndex()
    fired: dict[str, dict[str, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    totals: Counter[str] = Counter()
    t0 = time.perf_counter()
    for g in records:
        ids = [i for i in g.output_ids if i not in stop]
        text = tok.decode(ids)
        names = list(check_answer(g.output_ids, g.finish_reason, markers=markers, content=text))
        if index.seen(prompt_of(g), text) is not None:
            names.append("near_duplicate_answer")
        user = next((m.content or "" for m in reversed(g.messages) if m.role == "user"), "")
        if detect is not None and language_mismatch(user, text, detect):
            names.append("language_mismatch")
        totals[g.source] += 1
        for n in names:
            fired[n][g.source].append((g.id, text))
    took = time.perf_counter() - t0
    sources = sorted(totals)
    print(f"{len(records)} answers from {gt.name}; checks took {took:.2f} s (with decoding)")
    print()
    print("| check | " + " | ".join(sources) + " | all |")
    print("|---|" + "---|" * (len(sources) + 1))
    for name, _ in QUALITY_CHECKS:
        if name == "language_mismatch" and detect is None:
            print(f"| {name} | " + " | ".join("-" for _ in sources) + " | (py3langid missing) |")
            continue
        by = fired[name]
        cells = [f"{len(by[s])}/{totals[s]}" for s in sources]
        hits = sum(len(v) for v in by.values())
        print(f"| {name} | " + " | ".join(cells) + f" | {hits}/{len(records)} |")
    print()
    for name, desc in QUALITY_CHECKS:
        print(f"{name}: {desc}")
        for s in sources:
            for rid, text in fired[name][s][:3]:
                print(f"  {rid}: ...{text[-80:]!r}")
        print()


if __name__ == "__main__":
    main()
