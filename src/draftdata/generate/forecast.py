"""What a whole run will take, forecast from its own first answers (a pilot: a `limit`, or a run
stopped part-way): the plan's requests and rendered prompts, with each dataset's
answers so far giving its mean answer, prompt, cost and latency per request, what an answer
adds to the ledger, and, where the pilot was exported, each layout's bytes per sample.

Nothing is sent: a plan before any answer has only its bounds (``generate.plan``). A dataset
with no answer yet takes the run's means over every dataset answered; what is not measured
is said, not guessed. Wall time is the requests' summed latency over the backend's
concurrency: the datasets' drain tails and start-up come on top (the plan says so)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Manifest
from ..records.export import SUMS_FILE
from ..store.ledger import Ledger
from ..store.stats import answer_sums, pages_bytes, prompt_total
from .plan import Plan

#: answers a forecast needs before it says anything
MIN_ANSWERS = 20
NO_FORECAST = (
    f"forecast: none before {MIN_ANSWERS} answers (the table's bounds hold); run a pilot (a "
    "dataset `limit`, or stop the run part-way), then plan again"
)


@dataclass(frozen=True)
class Measured:
    """One dataset's answers so far: how many, and their sums."""

    answers: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0


@dataclass(frozen=True)
class Forecast:
    #: the answers the forecast stands on
    answers_seen: int
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    ledger_bytes: int
    #: seconds of generation at the backends' concurrency (tails and start-up not included)
    wall_s: float
    #: each exported file group's bytes (the shards, each trainer layout), where the pilot was
    #: exported: scaled by its samples and by its tokens, the lower and the higher (a sample's
    #: fixed columns weigh on short samples, its ids on long ones)
    export_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def measured(led: Ledger) -> dict[str, Measured]:
    """Each dataset's stored answers and their sums (prompt tokens: the server's count;
    latency: the answered attempts')."""
    return {name: Measured(*sums) for name, sums in answer_sums(led).items()}


def _export_bytes(run_dir: Path) -> dict[str, int]:
    """Each file group of the run's export by its sealed manifest's sizes (the shards, and each
    trainer layout's files; the preview, a fixed few samples, left out); {} where none. A folder
    listed through its SHA256SUMS (``export.sealed``) counts every file in it."""
    path = run_dir / "export" / "manifest.json"
    try:
        files = list(json.loads(path.read_text(encoding="utf-8")).get("files") or [])
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
    groups: dict[str, int] = {}
    for f in files:
        trainer, name = f.get("trainer"), str(f.get("path", ""))
        if trainer or name.startswith("shard-"):
            key = str(trainer or "shards")
            size = int(f.get("bytes") or 0)
            if name.endswith(f"/{SUMS_FILE}"):
                top = run_dir / "export" / name.split("/")[0]
                size = sum(q.stat().st_size for q in top.rglob("*") if q.is_file())
            groups[key] = groups.get(key, 0) + size
    return groups


def forecast(m: Manifest, p: Plan) -> Forecast | None:
    """The run's forecast from its ledger's answers so far; None under MIN_ANSWERS."""
    path = m.output_dir / "ledger.sqlite"
    if not path.is_file():
        return None
    led = Ledger.read(path)
    try:
        got = measured(led)
        per_answer = pages_bytes(led, ANSWER_TABLES)
        per_prompt = pages_bytes(led, PROMPT_TABLES)
        stored = prompt_total(led)
    finally:
        led.close()
    seen = sum(x.answers for x in got.values())
    if seen < MIN_ANSWERS:
        return None
    every = Measured(*(sum(getattr(x, f) for x in got.values()) for f in Measured.__annotations__))
    requests = prompt = completion = 0
    cost = busy = 0.0
    cfg = m.backends
    for d in p.datasets:
        own = got.get(d.name)
        x = own if own is not None and own.answers >= MIN_ANSWERS else every
        n = d.requests
        requests += n
        # one turn a prompt: plan's own rendering, exact; later turns hold the model's own
        # answers: the dataset's pilot (else plan's rendering, with the source's answers)
        single = n == d.prompts * m.dataset(d.name).samples_per_prompt
        ask = round(x.prompt_tokens / x.answers * n) if x is own and not single else d.prompt_tokens
        write = round(x.completion_tokens / x.answers * n)
        prompt, completion = prompt + ask, completion + write
        pin = getattr(cfg[d.backend], "price_in_per_mtok", 0.0)
        pout = getattr(cfg[d.backend], "price_out_per_mtok", 0.0)
        priced = (ask * pin + write * pout) / 1e6
        cost += priced if pin or pout else x.cost_usd / x.answers * n  # else the server's cost
        busy += x.latency_s / x.answers * n / max(_concurrency(m, d.backend), 1)
    size = sum(f.stat().st_size for f in path.parent.glob(path.name + "*"))
    # the pilot's export grown as its samples grow, and as its tokens (prompts and completions)
    had = every.prompt_tokens + every.completion_tokens
    grow = sorted((requests / seen, (prompt + completion) / had if had else requests / seen))
    export = {
        k: (round(v * grow[0]), round(v * grow[1])) for k, v in _export_bytes(m.output_dir).items()
    }
    # the file as it is, each prompt still to read, and each answer still to come
    prompts = sum(d.prompts for d in p.datasets)
    ledger = size + round(per_prompt / max(stored, 1) * max(prompts - stored, 0))
    ledger += round(per_answer / seen * max(requests - seen, 0))
    return Forecast(seen, requests, prompt, completion, cost, ledger, busy, export)


#: the tables and indexes an answer writes to (its sample too), and those a prompt does (with
#: its work keys)
ANSWER_TABLES = (
    "attempts",
    "responses",
    "samples",
    "attempts_key",
    "sqlite_autoindex_responses_1",
    "sqlite_autoindex_samples_1",
)
PROMPT_TABLES = (
    "prompts",
    "work",
    "prompts_order",
    "sqlite_autoindex_prompts_1",
    "sqlite_autoindex_work_1",
)


def _concurrency(m: Manifest, backend: str) -> int:
    return int(getattr(m.backends[backend], "concurrency", 1) or 1)
