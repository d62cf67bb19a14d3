"""All-turn preprocessing: SpecForge's own `preprocess_conversations` against `reconstruct --all-turns`.

The same ShareGPT conversations (the first 1,000, those that open with a user turn, alternate and
end with an answer), the same system prompt (SpecForge's llama3 template's), the same
tokenizer folder (../shared/tokenizers/llama3, loaded by transformers for SpecForge). SpecForge
(installed from PyPI as `make install` does, run as it is) renders each conversation with the
tokenizer's chat template, tokenizes it, and marks every assistant turn (its
`train_only_last_turn=False`); draftdata renders with its llama3 format and trains every turn in
one sequence (``Item(all_turns=True)``). CPU seconds of this process (all threads) for each,
medians of ``--repeats``, and the ratio per core (SpecForge runs on one core; draftdata's
encoders may use both, so CPU time is the fair measure). Ids and masks are compared per
conversation.

    python benchmarks/specforge_preprocess.py [--repeats 3] [--limit 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

from draftdata.tokens.target import Target

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
ROLES = {"human": "user", "gpt": "assistant"}


def conversations(limit: int) -> list[list[dict]]:
    out = []
    for c in json.loads((SHARED / "data" / "prompts" / "sharegpt_v3_first1000.json").read_text())[
        :limit
    ]:
        msgs = [
            {"role": ROLES.get(t["from"], t["from"]), "content": t["value"]}
            for t in c["conversations"]
        ]
        while msgs and msgs[-1]["role"] != "assistant":
            msgs.pop()
        roles = [m["role"] for m in msgs]
        if (
            roles
            and roles == ["user", "assistant"] * (len(roles) // 2)
            and all(m["content"] for m in msgs)
        ):
            out.append(msgs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=1000)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    warnings.filterwarnings("ignore")
    from specforge.data.preprocessing import preprocess_conversations
    from specforge.data.template import TEMPLATE_REGISTRY
    from transformers import AutoTokenizer

    from draftdata.formats import get_format
    from draftdata.records import ApiView
    from draftdata.records.wire import messages_of
    from draftdata.tokenizers import load_tokenizer
    from draftdata.tokens.reconstruct import Item

    folder = SHARED / "tokenizers" / "llama3"
    template = TEMPLATE_REGISTRY.get("llama3")
    hf = AutoTokenizer.from_pretrained(str(folder))
    bound = get_format("llama3").bind(load_tokenizer(folder))
    convs = conversations(args.limit)
    system = {"role": "system", "content": template.system_prompt}
    items = [
        Item(messages_of([system, *c[:-1]]), ApiView(c[-1]["content"], "stop"), record_id=str(i),
             all_turns=True)
        for i, c in enumerate(convs)
    ]  # fmt: skip
    theirs_s, ours_s = [], []
    for _ in range(args.repeats):
        t = time.process_time()
        theirs = preprocess_conversations(
            hf, convs, template, max_length=1 << 20, tools=[[] for _ in convs]
        )
        theirs_s.append(time.process_time() - t)
        t = time.process_time()
        ours = list(Target(bound).reconstruct_many(items))
        ours_s.append(time.process_time() - t)
    ids_equal = masks_equal = 0
    for s, ids, mask in zip(ours, theirs["input_ids"], theirs["loss_mask"], strict=True):
        if isinstance(s, Exception):
            continue
        ids_equal += s.input_ids == ids[0].tolist()
        masks_equal += (
            s.input_ids == ids[0].tolist() and [int(x) for x in s.loss_mask] == mask[0].tolist()
        )
    a, b = statistics.median(theirs_s), statistics.median(ours_s)
    n_tok = sum(len(s.input_ids) for s in ours if not isinstance(s, Exception))
    print(f"{len(convs)} conversations, {n_tok:,} tokens; encoder: {bound.tokenizer.encoder}")
    print(f"SpecForge preprocess_conversations (all turns): {a:.2f} CPU s")
    print(f"draftdata reconstruct_many(all_turns=True): {b:.2f} CPU s")
    print(
        f"ratio per core: {a / b:.1f}x; ids equal {ids_equal}/{len(convs)}, ids and masks equal {masks_equal}/{len(convs)}"
    )


if __name__ == "__main__":
    main()
