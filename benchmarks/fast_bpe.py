"""The tiktoken fast path against HF `tokenizers` on the same text: equal ids, and how much faster.

Every turn of the first 1,000 ShareGPT conversations (and each conversation's turns joined, as
reconstruction encodes them), for each byte-level BPE tokenizer.json in ../shared/tokenizers.
Both encoders are timed in this process on the same list, one ``encode_batch`` call each, medians
of ``--repeats``; the ids of every text are compared.

    python benchmarks/fast_bpe.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--tokenizers", nargs="+", default=["llama3", "qwen3", "smollm2", "deepseek-v3"]
    )
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from draftdata.tokenizers import load_tokenizer

    convs = json.loads((SHARED / "data" / "prompts" / "sharegpt_v3_first1000.json").read_text())
    turns = [t["value"] for c in convs for t in c["conversations"]]
    joined = ["\n".join(t["value"] for t in c["conversations"]) for c in convs]
    texts = turns + joined
    print(
        f"{len(convs)} conversations: {len(turns)} turns + {len(joined)} joined texts, "
        f"{sum(map(len, texts)):,} characters"
    )
    print("| tokenizer | encoder | texts equal | tokens | tokenizers s | fast s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for name in args.tokenizers:
        tok = load_tokenizer(SHARED / "tokenizers" / name)
        fast = tok._fast_and_why[0]
        plain = tok._plain
        slow_t, fast_t = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            want = [e.ids for e in plain.encode_batch(texts, add_special_tokens=False)]
            slow_t.append(time.perf_counter() - t)
            if fast is not None:
                t = time.perf_counter()
                got = fast.encode_batch(texts)
                fast_t.append(time.perf_counter() - t)
        n_tok = sum(map(len, want))
        if fast is None:
            print(
                f"| {name} | {tok.encoder} | – | {n_tok:,} | {statistics.median(slow_t):.2f} | – | – |"
            )
            continue
        equal = sum(a == b for a, b in zip(got, want, strict=True))
        s, f = statistics.median(slow_t), statistics.median(fast_t)
        print(
            f"| {name} | tiktoken ({'snapshot' if tok._snap else 'document'}) | {equal:,} / {len(texts):,} | {n_tok:,} | {s:.2f} | {f:.2f} | {s / f:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
