"""The rehearsal's eight datasets (`benchmarks/rehearsal.py`), in the shapes of the seed's
B1-B8, written in each dataset's native format from the real prompt files in
``../shared/data/prompts`` and read back by draftdata's own reader for that format.

Glaive, Magicoder and UltraChat are not on disk, so real prompts are written into their
documented formats (BFCL questions and functions as Glaive ``system`` / ``chat`` strings,
HumanEval tasks as Magicoder OSS-Instruct and Evol-Instruct records, ShareGPT conversations as
UltraChat ``data[]``). A file shorter than its share is repeated: copy ``r`` > 0 of a record
gets ``[variant r]`` after its first user text, so every prompt is distinct (the run drops a
prompt it has seen; the prompt id is a hash of the messages and tools). ShareGPT's
conversations are split between B5 and B6 so no conversation feeds both.

    DATASETS: name -> (share of the prompts, reader, turns, what it is)
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rehearsal_server import SHARED, _arguments

PROMPTS = SHARED / "data" / "prompts"

#: name -> (share of N, reader, turns, shape); the shares sum to 1
DATASETS: dict[str, tuple[float, str, str, str]] = {
    "b1-glaive-fc": (
        0.15,
        "glaive",
        "first",
        "function calling, Glaive v2 (`system` with JSON schemas, `chat` with USER/ASSISTANT "
        "and `<functioncall>`), from BFCL v4 simple_python + multiple questions and functions",
    ),
    "b2-bfcl-parallel": (
        0.05,
        "bfcl",
        "first",
        "parallel function calling, BFCL v4 JSON lines (`question`, `function`), from "
        "BFCL v4 parallel + parallel_multiple",
    ),
    "b3-magicoder-oss": (
        0.15,
        "magicoder-oss",
        "first",
        "code, Magicoder OSS-Instruct (`problem`, `solution`, `lang`, `seed`), from HumanEval",
    ),
    "b4-magicoder-evol": (
        0.10,
        "magicoder-evol",
        "first",
        "code, Magicoder Evol-Instruct (`instruction`, `response`), from HumanEval",
    ),
    "b5-sharegpt-chat": (
        0.25,
        "sharegpt",
        "first",
        "chat, ShareGPT (`id`, `conversations[{from, value}]`), from ShareGPT V3 (single-turn "
        "and every other multi-turn conversation) and FastChat's sample conversations",
    ),
    "b6-ultrachat-multiturn": (
        0.15,
        "ultrachat",
        "all",
        "multi-turn chat, UltraChat (`id`, `data[]`), from the other multi-turn ShareGPT V3 "
        "conversations, cut to their first 3 user turns; every turn answered on-policy",
    ),
    "b7-mtbench-multiturn": (
        0.05,
        "mtbench",
        "all",
        "multi-turn, MT-Bench (`question_id`, `category`, `turns[]`), both turns on-policy",
    ),
    "b8-writingbench": (
        0.10,
        "writingbench",
        "first",
        "long-form writing, WritingBench (`index`, `domain1`, `domain2`, `query`), "
        "English and Chinese",
    ),
}


@dataclass(frozen=True)
class Built:
    name: str
    reader: str
    turns: str
    path: Path
    prompts: int
    #: answers the run must make: a prompt's user turns under turns = "all", else 1
    answers: int
    unique: int
    shape: str


def split(n: int) -> dict[str, int]:
    """``n`` prompts over the datasets by their shares (largest remainder)."""
    raw = {k: v[0] * n for k, v in DATASETS.items()}
    out = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: raw[k] - out[k], reverse=True)[: n - sum(out.values())]:
        out[k] += 1
    return out


def mark(text: str, rep: int) -> str:
    return text if rep == 0 else f"{text}\n\n[variant {rep}]"


def _copies(base: Sequence[Any], count: int) -> Iterator[tuple[int, int, Any]]:
    """(k, rep, record) for k < count: the base records in order, again and again."""
    for k in range(count):
        yield k, k // len(base), base[k % len(base)]


def _jsonl(path: Path, records: Iterator[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def _bfcl(*names: str) -> list[dict[str, Any]]:
    out = []
    for name in names:
        with (PROMPTS / f"BFCL_v4_{name}.json").open(encoding="utf-8") as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def _user_text(question: Any) -> str:
    turns = question if isinstance(question, list) else [[{"role": "user", "content": question}]]
    flat = [m for t in turns for m in (t if isinstance(t, list) else [t])]
    return "\n".join(m["content"] for m in flat if m.get("role") == "user")


def _humaneval() -> list[dict[str, Any]]:
    with gzip.open(PROMPTS / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _sharegpt() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """ShareGPT V3 conversations with a user turn: (single-turn, multi-turn)."""
    single, multi = [], []
    for conv in json.loads((PROMPTS / "sharegpt_v3_first1000.json").read_text("utf-8")):
        turns = conv.get("conversations") or []
        users = [t for t in turns if t.get("from") == "human"]
        if not users or not all(isinstance(t.get("value"), str) for t in turns):
            continue
        if not all(t["value"].strip() for t in turns):
            continue
        (multi if len(users) >= 2 else single).append(conv)
    return single, multi


# --- the eight writers: (folder, count) -> (path, answers, unique) ------------------------------
def b1_glaive(out: Path, count: int) -> tuple[Path, int, int]:
    from draftdata.sources.native import json_schema

    base = _bfcl("simple_python", "multiple")
    rng = random.Random(0)

    def records() -> Iterator[dict[str, Any]]:
        for k, rep, rec in _copies(base, count):
            fns = [
                {**f, "parameters": json_schema(f.get("parameters", {}))} for f in rec["function"]
            ]
            system = (
                "SYSTEM: You are a helpful assistant with access to the following functions. "
                "Use them if required -\n" + "\n".join(json.dumps(f, indent=4) for f in fns)
            )
            fn = fns[0]
            words = [w for w in _user_text(rec["question"]).split() if w.isalpha()] or ["x"]
            args = json.dumps(_arguments(rng, fn.get("parameters"), words))
            chat = (
                f"USER: {mark(_user_text(rec['question']), rep)}\n\n\nASSISTANT: <functioncall> "
                f'{{"name": "{fn["name"]}", "arguments": \'{args}\'}} <|endoftext|>\n'
            )
            yield {"id": f"glaive-{k}", "system": system, "chat": chat}

    path = out / "b1-glaive.jsonl"
    _jsonl(path, records())
    return path, count, len(base)


def b2_bfcl(out: Path, count: int) -> tuple[Path, int, int]:
    base = _bfcl("parallel", "parallel_multiple")

    def records() -> Iterator[dict[str, Any]]:
        for _, rep, rec in _copies(base, count):
            q = json.loads(json.dumps(rec["question"]))
            first = next(m for t in q for m in t if m.get("role") == "user")
            first["content"] = mark(first["content"], rep)
            rid = rec["id"] if rep == 0 else f"{rec['id']}-{rep}"
            yield {"id": rid, "question": q, "function": rec["function"]}

    path = out / "b2-bfcl-parallel.jsonl"
    _jsonl(path, records())
    return path, count, len(base)


def b3_magicoder_oss(out: Path, count: int) -> tuple[Path, int, int]:
    base = _humaneval()

    def records() -> Iterator[dict[str, Any]]:
        for k, rep, t in _copies(base, count):
            problem = (
                f"You are tasked with implementing the Python function `{t['entry_point']}`. "
                "Its signature and docstring are given below; write the body so that it "
                "behaves as the docstring describes, including the examples.\n\n"
                f"```python\n{t['prompt'].strip()}\n```"
            )
            yield {
                "index": k,
                "lang": "python",
                "seed": t["prompt"].strip().splitlines()[0],
                "problem": mark(problem, rep),
                "solution": f"```python\n{t['prompt']}{t['canonical_solution']}```",
            }

    path = out / "b3-magicoder-oss.jsonl"
    _jsonl(path, records())
    return path, count, len(base)


def b4_magicoder_evol(out: Path, count: int) -> tuple[Path, int, int]:
    base = _humaneval()

    def records() -> Iterator[dict[str, Any]]:
        for _, rep, t in _copies(base, count):
            instruction = (
                "Write a Python function that meets the following specification, then explain "
                "its time complexity and one edge case it handles.\n\n"
                f"{t['prompt'].strip()}"
            )
            yield {
                "instruction": mark(instruction, rep),
                "response": t["prompt"] + t["canonical_solution"],
            }

    path = out / "b4-magicoder-evol.jsonl"
    _jsonl(path, records())
    return path, count, len(base)


def b5_sharegpt(out: Path, count: int) -> tuple[Path, int, int]:
    single, multi = _sharegpt()
    fastchat = json.loads((PROMPTS / "fastchat_dummy_conversation.json").read_text("utf-8"))
    seen: set[str] = set()
    base = []
    for conv in single + multi[0::2] + fastchat:  # ShareGPT repeats some conversations
        key = json.dumps(conv["conversations"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            base.append(conv)

    def records() -> Iterator[dict[str, Any]]:
        for _, rep, conv in _copies(base, count):
            turns = [dict(t) for t in conv["conversations"]]
            first = next(t for t in turns if t["from"] == "human")
            first["value"] = mark(first["value"], rep)
            yield {"id": f"{conv['id']}-{rep}", "conversations": turns}

    path = out / "b5-sharegpt.jsonl"
    _jsonl(path, records())
    return path, count, len(base)


def _ultrachat_data(conv: dict[str, Any], user_turns: int = 3) -> list[str] | None:
    """The conversation as UltraChat's alternating ``data[]``, from its first user turn, cut
    to ``user_turns`` user turns (with the answers between them); None if it does not
    alternate."""
    turns = conv["conversations"]
    start = next(i for i, t in enumerate(turns) if t["from"] == "human")
    data: list[str] = []
    for i, t in enumerate(turns[start:]):
        if t["from"] != ("human" if i % 2 == 0 else "gpt"):
            return None
        data.append(t["value"])
    users = data[0::2][:user_turns]
    answers = data[1::2][: len(users)]
    out = [x for pair in zip(users, answers, strict=False) for x in pair]
    if len(answers) < len(users):
        out.append(users[-1])
    return out if len(users) >= 2 else None


def b6_ultrachat(out: Path, count: int) -> tuple[Path, int, int]:
    _, multi = _sharegpt()
    base = [(c["id"], d) for c in multi[1::2] if (d := _ultrachat_data(c)) is not None]
    answers = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal answers
        for _, rep, (cid, data) in _copies(base, count):
            answers += len(data[0::2])
            yield {"id": f"{cid}-{rep}", "data": [mark(data[0], rep), *data[1:]]}

    path = out / "b6-ultrachat.jsonl"
    _jsonl(path, records())
    return path, answers, len(base)


def b7_mtbench(out: Path, count: int) -> tuple[Path, int, int]:
    with (PROMPTS / "mt_bench_question.jsonl").open(encoding="utf-8") as f:
        base = [json.loads(line) for line in f if line.strip()]
    answers = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal answers
        for _, rep, q in _copies(base, count):
            answers += len(q["turns"])
            turns = [mark(q["turns"][0], rep), *q["turns"][1:]]
            qid = q["question_id"] + 1000 * rep
            yield {"question_id": qid, "category": q["category"], "turns": turns}

    path = out / "b7-mtbench.jsonl"
    _jsonl(path, records())
    return path, answers, len(base)


def b8_writingbench(out: Path, count: int) -> tuple[Path, int, int]:
    with (PROMPTS / "writingbench_200.jsonl").open(encoding="utf-8") as f:
        base = [json.loads(line) for line in f if line.strip()]

    def records() -> Iterator[dict[str, Any]]:
        for k, rep, r in _copies(base, count):
            keep = {x: r[x] for x in ("domain1", "domain2", "checklist") if x in r}
            yield {"index": k, **keep, "query": mark(r["query"], rep)}

    path = out / "b8-writingbench.jsonl"
    _jsonl(path, records())
    return path, count, len(base)


WRITERS: dict[str, Callable[[Path, int], tuple[Path, int, int]]] = {
    "b1-glaive-fc": b1_glaive,
    "b2-bfcl-parallel": b2_bfcl,
    "b3-magicoder-oss": b3_magicoder_oss,
    "b4-magicoder-evol": b4_magicoder_evol,
    "b5-sharegpt-chat": b5_sharegpt,
    "b6-ultrachat-multiturn": b6_ultrachat,
    "b7-mtbench-multiturn": b7_mtbench,
    "b8-writingbench": b8_writingbench,
}


def build(out: Path, n: int) -> list[Built]:
    """Writes the eight source files under ``out`` for ``n`` prompts in all."""
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for name, count in split(n).items():
        _, reader, turns, shape = DATASETS[name]
        path, answers, unique = WRITERS[name](out, count)
        built.append(Built(name, reader, turns, path, count, answers, unique, shape))
    return built


def check_readers(built: Sequence[Built]) -> dict[str, dict[str, Any]]:
    """Each file read through draftdata's reader, as the run will read it: prompts, distinct
    prompt ids, and what the reader skipped."""
    from collections import Counter

    from draftdata.sources import READERS

    out = {}
    everywhere: set[str] = set()
    for b in built:
        skipped: Counter[str] = Counter()
        ids = set()
        n = 0
        for p in READERS[b.reader](b.path, b.name, {}, skipped):
            n += 1
            ids.add(p.id)
        out[b.name] = {
            "read": n,
            "distinct": len(ids),
            "seen_in_an_earlier_dataset": len(ids & everywhere),
            "skipped": dict(skipped),
        }
        everywhere |= ids
    return out
