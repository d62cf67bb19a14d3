"""Write tests/golden/reconstruct_<format>.json with the real tokenizers.

    python tests/make_golden.py

The test suite checks every file against the models' own chat templates where the template renders
the final assistant turn verbatim, and checks that every reasoning shape gives the same ids."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cases import bfcl_tools
from conftest import PROMPTS, REAL
from draftdata.formats import get_format
from draftdata.records.wire import messages_of, view_from_record
from draftdata.tokenizers import load_tokenizer
from draftdata.tokens.target import Target
from golden_cases import CASES, shapes

OUT = Path(__file__).parent / "golden"


def build(key: str) -> dict:
    spec, fmt_name, tpl = REAL[key]
    tok = load_tokenizer(spec, tpl)
    bound = get_format(fmt_name).bind(tok)
    fmt = bound.format
    tools = bfcl_tools(PROMPTS / "BFCL_v4_multiple.json")[0]
    cases = []
    for case in CASES[key]:
        th = fmt.think
        variants = shapes(
            case["reasoning"],
            case["content"],
            case["tool_calls"],
            case["finish"],
            *(
                (
                    fmt.markers[th.open].text,
                    fmt.markers[th.close].text,
                    th.prompt_opens,
                    (th.open_suffix, th.close_prefix, th.close_suffix),
                )
                if th
                else ()
            ),
        )
        if th is None:
            variants = {"plain": variants["reasoning_content"]}
        ids = None
        for name, resp in variants.items():
            s = Target(bound).reconstruct(
                messages_of(case["messages"]),
                view_from_record(resp),
                tools=tools if case.get("tools") and fmt.supports_tools else (),
            )
            if ids is None:
                ids, prompt_len = s.input_ids, s.prompt_len
            assert s.input_ids == ids, f"{key}/{case['name']}: {name} differs"
        cases.append(
            {
                **case,
                "use_tools": bool(case.get("tools") and fmt.supports_tools),
                "responses": variants,
                "input_ids": ids,
                "prompt_len": prompt_len,
                "tokens": [tok.token_str(i) for i in ids[prompt_len:]],
            }
        )
    return {
        "tokenizer": spec,
        "tokenizer_sha256": tok.sha256,
        "format": fmt.name,
        "format_version": fmt.version,
        "cases": cases,
    }


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for key in CASES:
        doc = build(key)
        path = OUT / f"reconstruct_{key}.json"
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {path} ({len(doc['cases'])} cases)")
