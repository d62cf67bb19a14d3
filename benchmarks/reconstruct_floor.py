"""`draftdata reconstruct` against the raw encode of the same text: the floor of the tokens stage.

Cases (each a JSONL of answers in the shape `reconstruct` reads):

- ``gt``: the SmolLM2 ground truth (dev file, 531 short answers), chatml, SmolLM2's tokenizer,
  ``--copies`` times with the id changed;
- ``sharegpt-qwen3`` / ``sharegpt-llama3`` / ``sharegpt-kimi-k2``: the first 1,000 ShareGPT
  conversations, the last assistant turn as the answer (``finish_reason: stop``), ``--copies``
  times with the id changed (enough work for start-up to matter only as it does for a user).

Per case and repeat, in one process, one after the other:

- **floor**: the tokenizer library itself (HF ``tokenizers`` or tiktoken) encoding, in one
  ``encode_batch`` call, the text our output stands for (each record's rendered prompt and answer
  as one string, control tokens included as text), tokenizer already loaded;
- **cli**: ``draftdata reconstruct IN -o OUT.parquet`` as a subprocess, start-up included;
- **library**: ``tokens.reconstruct_many`` in this process (no start-up, no Parquet).

Where the tokenizer is on gigatoken (Kimi K2: ``tokenizers/fast_tiktoken.py``), gigatoken's own
``encode_batch_list`` of the same text is timed too (**giga floor**), beside tiktoken's: the floor
of the encoder draftdata uses. gigatoken keeps each piece it has encoded, so ``--copies`` above 1
repeats whole texts it has seen (in the giga floor as in ours); ``--copies 1`` shows each text
once.

Reported: seconds (median of ``--repeats``), and floor/cli, floor/library (1.0 = as fast as the
raw encode). The sha256 of every sample's ids and mask is printed so a change can be checked to
produce identical ids.

    python benchmarks/reconstruct_floor.py [--repeats 3] [--copies 4] [--cases gt sharegpt-qwen3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftdata.tokens.target import Target

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
SHAREGPT = SHARED / "data" / "prompts" / "sharegpt_v3_first1000.json"
TOK = SHARED / "tokenizers"
CASES = {
    "gt": (TOK / "smollm2", "chatml"),
    "sharegpt-qwen3": (TOK / "qwen3", "qwen3"),
    "sharegpt-llama3": (TOK / "llama3", "llama3"),
    "sharegpt-kimi-k2": (TOK / "kimi-k2", "kimi-k2"),
}
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def sharegpt_answers(copies: int) -> list[dict]:
    out = []
    for conv in json.loads(SHAREGPT.read_text()):
        msgs = [
            {"role": ROLES[t["from"]], "content": t["value"]}
            for t in conv["conversations"]
            if t.get("from") in ROLES
        ]
        while msgs and msgs[-1]["role"] != "assistant":
            msgs.pop()
        if len(msgs) < 2 or not msgs[-1]["content"]:
            continue
        *history, last = msgs
        out.append(
            {
                "id": conv["id"],
                "messages": history,
                "api_view": {"content": last["content"], "finish_reason": "stop"},
            }
        )
    return [{**r, "id": f"{r['id']}-{c}"} for c in range(copies) for r in out]


def answers(case: str, copies: int) -> list[dict]:
    if case == "gt":
        recs = [json.loads(line) for line in GT.read_text().splitlines() if line.strip()]
        return [{**r, "id": f"{r['id']}-{c}"} for c in range(copies) for r in recs]
    return sharegpt_answers(copies)


def raw_encoder(tokenizer):  # type: ignore[no-untyped-def]
    """The library's own batch encode, as a user of the library would call it."""
    enc = getattr(tokenizer, "_enc", None)
    if enc is not None:  # tiktoken
        return lambda texts: enc.encode_batch(texts, allowed_special="all")
    full = tokenizer._full
    return lambda texts: [e.ids for e in full.encode_batch(texts, add_special_tokens=False)]


def giga_encoder(tokenizer):  # type: ignore[no-untyped-def]
    """gigatoken's own batch encode over the same rank file, where draftdata's tokenizer is on
    it (a fresh encoder: no piece seen before); else None."""
    if getattr(tokenizer, "_enc", None) is None:  # not tiktoken (HF's fast path is its own)
        return None
    fast = getattr(tokenizer, "_fast_and_why", (None, ""))[0]
    if fast is None:
        return None
    import gigatoken

    specials = dict(tokenizer._enc._special_tokens)  # the floor's text holds them: allowed

    def encode(texts):  # type: ignore[no-untyped-def]
        tok = gigatoken.Tokenizer.from_tiktoken(
            str(fast.path), pretokenizer=fast.scheme, special_tokens=specials
        )
        t = time.perf_counter()
        out = tok.encode_batch_list(texts)
        return out, time.perf_counter() - t

    return encode


def library(rc, bound, items):  # type: ignore[no-untyped-def]
    """The samples, through the target's batched call (``Target.reconstruct_many``)."""
    ids = [str(r.get("id", i)) for i, (_, _, r) in enumerate(items)]
    todo = (rc.Item(m, v, record_id=x) for (m, v, _), x in zip(items, ids, strict=True))
    yield from (s for s in Target(bound).reconstruct_many(todo) if not isinstance(s, Exception))


def streamed(samples):  # type: ignore[no-untyped-def]
    """Consume the samples as a user's loop would, one at a time (holding millions of id lists
    makes the garbage collector's full passes grow with the input, which no streaming user
    pays). The ids digest is taken in a separate, untimed pass."""
    h = hashlib.sha256()
    n = 0
    for s in samples:
        h.update(json.dumps([s.id, s.input_ids, s.loss_mask]).encode())
        n += 1
    return n, h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--copies", type=int, default=4)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "src"))
    from draftdata.formats import get_format
    from draftdata.records.wire import messages_of, view_from_record
    from draftdata.tokenizers import load_tokenizer
    from draftdata.tokens import reconstruct as rc
    from draftdata.tokens.response import response_segments

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            tok_path, fmt = CASES[case]
            recs = answers(case, args.copies)
            src = Path(tmp) / f"{case}.jsonl"
            src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
            bound = get_format(fmt).bind(load_tokenizer(str(tok_path)))
            items = [(messages_of(r["messages"]), view_from_record(r), r) for r in recs]
            texts = []
            for msgs, view, _ in items:
                segs = bound.format.render_prompt(msgs, ())
                resp, _w = response_segments(bound, view)
                texts.append(bound.render_text(segs) + bound.render_text(resp))
            encode = raw_encoder(bound.tokenizer)
            encode(texts[:8])  # warm
            giga = giga_encoder(bound.tokenizer)
            floor, cli, lib, gfloor = [], [], [], []
            for _ in range(args.repeats):
                t = time.perf_counter()
                n_tokens = sum(len(x) for x in encode(texts))
                floor.append(time.perf_counter() - t)
                if giga is not None:
                    got, secs = giga(texts)
                    assert sum(map(len, got)) == n_tokens
                    gfloor.append(secs)
                out = Path(tmp) / f"{case}.parquet"
                t = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "draftdata", "reconstruct", str(src), "-t",
                     str(tok_path), "-f", fmt, "-o", str(out)],
                    check=True, stdout=subprocess.DEVNULL, env=env,
                )  # fmt: skip
                cli.append(time.perf_counter() - t)
                t = time.perf_counter()
                for _ in library(rc, bound, items):  # streamed, as the CLI and a user consume it
                    pass
                lib.append(time.perf_counter() - t)
            f, c, li = (statistics.median(x) for x in (floor, cli, lib))
            _, ids = streamed(library(rc, bound, items))
            rows.append((case, len(recs), n_tokens, f, c, li, ids))
            g = f"; giga floor {statistics.median(gfloor):.2f} s" if gfloor else ""
            g += f" (giga/cli {statistics.median(gfloor) / c:.2f}x)" if gfloor else ""
            print(
                f"{case}: {len(recs)} records, {n_tokens:,} tokens; floor {f:.2f} s, "
                f"cli {c:.2f} s ({f / c:.2f}x), library {li:.2f} s ({f / li:.2f}x){g}, "
                f"ids {ids}",
                flush=True,
            )
    print("\n| case | records | tokens | floor s | cli s | floor/cli | library s | floor/library |")
    print("|---|---|---|---|---|---|---|---|")
    for case, n, nt, f, c, li, _ in rows:
        print(
            f"| {case} | {n:,} | {nt:,} | {f:.2f} | {c:.2f} | {f / c:.2f} | {li:.2f} | {f / li:.2f} |"
        )


if __name__ == "__main__":
    main()
