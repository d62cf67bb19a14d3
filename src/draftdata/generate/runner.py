"""Generation at scale: prompts -> backend -> ledger -> samples, resumable and within budget.

Resume is the same command again: only (prompt, sample, turn) keys with no stored response are
asked for. With ``turns = "all"`` every user turn is answered given the model's own earlier
answers (on-policy multi-turn regeneration)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from ..errors import DraftdataError, ReconstructError
from ..formats import BoundFormat, get_format
from ..manifest import DatasetCfg, HFBackendCfg, Manifest, OpenAIBackendCfg
from ..records import ApiView, Message, Prompt
from ..sources import read_prompts
from ..store.ledger import Key, Ledger, StoredResponse
from ..tokenizers import load_tokenizer
from ..tokens.reconstruct import FINISHED, provenance, reconstruct
from .backends.base import Backend, Completion, FailedAttempt, GenRequest


class GenerateError(DraftdataError):
    """Generation cannot start or continue."""


# --- conversations -------------------------------------------------------------------------------
def user_turns(p: Prompt) -> list[int]:
    """Indices of the user messages of a prompt (each one a turn to answer)."""
    return [i for i, m in enumerate(p.messages) if m.role == "user"]


def n_turns(p: Prompt, mode: str) -> int:
    return len(user_turns(p)) if mode == "all" else 1


def turn_messages(
    p: Prompt, mode: str, turn: int, answers: Sequence[Message]
) -> tuple[Message, ...]:
    """The conversation the model answers at ``turn``: with ``all``, earlier assistant turns are
    the model's own ``answers``; with ``last``, the dataset's conversation up to its last user
    message; with ``first``, up to the first user message."""
    ut = user_turns(p)
    if not ut:
        raise GenerateError(f"prompt {p.id} of {p.dataset} has no user message")
    if mode == "first":
        return p.messages[: ut[0] + 1]
    if mode == "last":
        return p.messages[: ut[-1] + 1]
    head = list(p.messages[: ut[0]])  # system messages
    for t in range(turn + 1):
        end = ut[t + 1] if t + 1 < len(ut) else len(p.messages)
        # this turn's user message and any tool results after it, but not dataset answers
        head += [m for m in p.messages[ut[t] : end] if m.role != "assistant"]
        if t < turn:
            head.append(answers[t])
    return tuple(head)


TOOLS_SYSTEM = (
    "You can call these functions: {tools}\nTo call functions, answer with a JSON object "
    '{{"name": ..., "arguments": {{...}}}} or a JSON list of such objects.'
)


def tools_as_system(p: Prompt) -> Prompt:
    """Tool schemas written into the system message as text, for formats whose chat template
    has no tool prompt (the way the SmolLM2 ground truth shows BFCL functions)."""
    if not p.tools:
        return p
    text = TOOLS_SYSTEM.format(tools=json.dumps(list(p.tools), ensure_ascii=False))
    msgs = list(p.messages)
    if msgs and msgs[0].role == "system":
        msgs[0] = Message("system", (msgs[0].content or "") + "\n\n" + text)
    else:
        msgs.insert(0, Message("system", text))
    return Prompt(p.id, p.dataset, tuple(msgs), (), {**p.metadata, "tools_in_system": True})


def answer_message(view: ApiView) -> Message:
    return Message(
        "assistant", view.content or "", reasoning=view.reasoning, tool_calls=view.tool_calls
    )


def sample_seed(base: int, prompt_id: str, sample_idx: int, turn: int) -> int:
    h = hashlib.sha256(f"{base}:{prompt_id}:{sample_idx}:{turn}".encode()).hexdigest()
    return int(h[:8], 16)


# --- progress ----------------------------------------------------------------------------------
@dataclass
class Meter:
    total: int
    done: int = 0
    errors: int = 0
    tokens: int = 0
    cost: float = 0.0
    started: float = field(default_factory=time.time)
    #: answers that were already in the ledger when this session started (not this session's rate)
    resumed: int = 0


class Bars:
    def __init__(self, quiet: bool, console: Console | None = None) -> None:
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[rps]:.1f} req/s {task.fields[tps]:.0f} tok/s"),
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("${task.fields[cost]:.4f}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=quiet,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}
        self.meters: dict[str, Meter] = {}

    def __enter__(self) -> Bars:
        self.progress.__enter__()
        return self

    def __exit__(self, *a: Any) -> None:
        self.progress.__exit__(*a)

    def add(self, name: str, total: int, done: int) -> None:
        self.meters[name] = Meter(total, done, resumed=done)
        self.tasks[name] = self.progress.add_task(
            name, total=total, completed=done, rps=0.0, tps=0.0, errors=0, cost=0.0
        )

    def update(
        self, name: str, *, done: int = 0, errors: int = 0, tokens: int = 0, cost: float = 0.0
    ) -> None:
        m = self.meters[name]
        m.done += done
        m.errors += errors
        m.tokens += tokens
        m.cost += cost
        dt = max(time.time() - m.started, 1e-6)
        self.progress.update(
            self.tasks[name],
            completed=m.done,
            rps=(m.done - m.resumed) / dt,
            tps=m.tokens / dt,
            errors=m.errors,
            cost=m.cost,
        )


# --- the runner ----------------------------------------------------------------------------------
@dataclass
class RunReport:
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    budget_stopped: bool = False
    spent_usd: float = 0.0


class Runner:
    def __init__(
        self, manifest: Manifest, *, quiet: bool = False, console: Console | None = None
    ) -> None:
        self.m = manifest
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        out = manifest.output_dir
        out.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(out / "ledger.sqlite")
        t = manifest.target
        tok = load_tokenizer(
            manifest.resolve(t.tokenizer) if not t.tokenizer.startswith("pkg:") else t.tokenizer,
            manifest.resolve(t.chat_template) if t.chat_template else None,
        )
        self.bound: BoundFormat = get_format(t.format, relative_to=manifest.base_dir).bind(tok)
        self.backends: dict[str, Backend] = {}
        self.text_ids: Callable[[str, list[int]], list[int]] | None = None
        if t.prefs:
            from ..tokens.prefs import SplitPrefs

            prefs_path = manifest.resolve(t.prefs)
            prefs = SplitPrefs.load(prefs_path)
            prefs.check_tokenizer(tok, prefs_path)
            self.text_ids = prefs.applier(tok)
        self.spent = float(self.ledger.status()["cost_usd"])
        self.reserved = 0.0
        self.budget_hit = False
        self.ledger.set_meta(
            "manifest", manifest.model_dump(mode="json", exclude={"base_dir", "path"})
        )
        self.ledger.set_meta("manifest_base_dir", str(manifest.base_dir))

    # --- setup ---------------------------------------------------------------------------
    def backend(self, name: str) -> Backend:
        if name not in self.backends:
            cfg = self.m.backends[name]
            if isinstance(cfg, OpenAIBackendCfg):
                from .backends.openai_api import OpenAIBackend

                self.backends[name] = OpenAIBackend(name, cfg, self.m.target.model)
            elif isinstance(cfg, HFBackendCfg):
                from .backends.local import HFBackend

                self.backends[name] = HFBackend(name, cfg, self.m, self.bound)
            else:
                from .backends.engines import make_engine_backend

                self.backends[name] = make_engine_backend(name, cfg, self.m, self.bound)
        return self.backends[name]

    def prompts(self, d: DatasetCfg) -> list[Prompt]:
        stored = self.ledger.prompts(d.name)
        if stored:
            return stored
        prompts, drops = read_prompts(
            self.m.resolve(d.source), d.reader, d.name, d.columns, d.limit
        )
        if d.tools_prompt == "system":
            prompts = [tools_as_system(p) for p in prompts]
        # a prompt already in an earlier dataset of this run is dropped here, and counted
        earlier = self.ledger.prompt_ids(exclude=d.name)
        kept = [p for p in prompts if p.id not in earlier]
        if len(kept) < len(prompts):
            drops["duplicate_across_datasets"] += len(prompts) - len(kept)
        prompts = kept
        if not prompts:
            raise GenerateError(
                f"dataset {d.name}: {d.source} gave no prompts (skipped: {dict(drops)})"
            )
        self.ledger.add_prompts(
            d.name, prompts, d.samples_per_prompt, lambda p: n_turns(p, d.turns)
        )
        self.ledger.set_meta(f"read_drops:{d.name}", dict(drops))
        return prompts

    def request(
        self, d: DatasetCfg, p: Prompt, s: int, turn: int, msgs: tuple[Message, ...]
    ) -> GenRequest:
        opts = {} if self.m.target.thinking is None else {"thinking": self.m.target.thinking}
        ids = self.bound.prompt_ids(msgs, p.tools, **opts)
        return GenRequest(
            Key(d.name, p.id, s, turn),
            msgs,
            p.tools,
            ids,
            d.sampling,
            sample_seed(d.sampling.seed, p.id, s, turn),
        )

    # --- recording -----------------------------------------------------------------------------
    def on_failure(self, bars: Bars, req: GenRequest, f: FailedAttempt, backend: str) -> None:
        self.ledger.record_attempt(
            req.key,
            backend,
            ok=False,
            reason=f.reason,
            http_status=f.http_status,
            started_at=f.started_at,
            latency_s=f.latency_s,
            request=f.request,
            response_text=f.response_text,
            final_failure=f.final,
        )
        bars.update(req.key.dataset, errors=1, done=int(f.final))

    def store(self, bars: Bars, req: GenRequest, c: Completion, backend: Backend) -> None:
        drift = None
        if c.prompt_ids is not None:
            drift = int(list(c.prompt_ids) != req.prompt_ids)
        self.ledger.record_attempt(
            req.key,
            backend.name,
            ok=True,
            reason=None,
            http_status=c.http_status,
            started_at=c.started_at,
            latency_s=c.latency_s,
            request=c.request,
            response_text=c.response_text,
            stored={
                "response": c.response,
                "output_ids": c.output_ids,
                "prompt_ids": c.prompt_ids,
                "finish_reason": c.finish_reason,
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                "cost_usd": c.cost_usd,
                "prompt_drift": drift,
                "our_prompt_ids": req.prompt_ids,
            },
        )
        self.spent += c.cost_usd
        bars.update(req.key.dataset, done=1, tokens=c.completion_tokens or 0, cost=c.cost_usd)

    def reserve(self, backend: Backend, req: GenRequest) -> float | None:
        """Reserve the most this request can cost; None when it could pass the budget."""
        budget = self.m.run.budget_usd
        est = backend.max_cost(req)
        if budget is not None and self.spent + self.reserved + est > budget:
            self.budget_hit = True
            return None
        self.reserved += est
        return est

    # --- running -------------------------------------------------------------------------------
    async def run(self, names: Iterable[str] | None = None) -> RunReport:
        chosen = [self.m.dataset(n) for n in names] if names else list(self.m.datasets)
        rep = RunReport()
        with Bars(self.quiet, self.console) as bars:
            try:
                for d in chosen:
                    await self.run_dataset(d, bars)
            finally:
                for b in self.backends.values():
                    await b.aclose()
                self.backends.clear()  # their locks and sessions belong to this event loop
        for d in chosen:
            rep.datasets[d.name] = self.make_samples(d)
        rep.budget_stopped = self.budget_hit
        rep.spent_usd = self.spent
        return rep

    async def run_dataset(self, d: DatasetCfg, bars: Bars) -> None:
        prompts = self.prompts(d)
        backend = self.backend(d.backend)
        pending = self.ledger.pending(d.name)
        total = sum(n_turns(p, d.turns) for p in prompts) * d.samples_per_prompt
        bars.add(d.name, total, total - len(pending))
        if not pending:
            return
        answers = self.ledger.responses(d.name)
        chains = [
            (p, s)
            for p in prompts
            for s in range(d.samples_per_prompt)
            if any(Key(d.name, p.id, s, t) in pending for t in range(n_turns(p, d.turns)))
        ]
        cfg = self.m.backends[d.backend]
        if isinstance(cfg, OpenAIBackendCfg):
            # a pool of workers pulls conversations: memory stays O(concurrency), and requests
            # start streaming at once instead of after every prompt has been rendered
            queue = deque(chains)

            async def worker() -> None:
                while queue and not self.budget_hit:
                    p, s = queue.popleft()
                    await self.chain(d, p, s, backend, answers, bars)

            await asyncio.gather(*(worker() for _ in range(min(cfg.concurrency, len(chains)))))
        else:
            await self.rounds(d, chains, backend, answers, bars)

    async def chain(
        self,
        d: DatasetCfg,
        p: Prompt,
        s: int,
        backend: Backend,
        answers: dict[Key, StoredResponse],
        bars: Bars,
    ) -> None:
        """One conversation, turn by turn (each turn waits for the model's previous answer)."""
        own: list[Message] = []
        for t in range(n_turns(p, d.turns)):
            key = Key(d.name, p.id, s, t)
            if key in answers:
                own.append(answer_message(_view(answers[key], self.bound)))
                continue
            req = self.request(d, p, s, t, turn_messages(p, d.turns, t, own))
            est = self.reserve(backend, req)
            if est is None:
                return  # scheduling stops before the budget could be passed
            try:
                [c] = await backend.run_batch(
                    [req], lambda r, f: self.on_failure(bars, r, f, backend.name)
                )
            finally:
                self.reserved -= est
            if c is None:
                return  # recorded as failed; a later turn cannot be asked without this one
            self.store(bars, req, c, backend)
            own.append(answer_message(c.view))

    async def rounds(
        self,
        d: DatasetCfg,
        chains: list[tuple[Prompt, int]],
        backend: Backend,
        answers: dict[Key, StoredResponse],
        bars: Bars,
    ) -> None:
        """Local engines: every conversation's turn t in batches, then turn t+1."""
        own: dict[tuple[str, int], list[Message]] = {(p.id, s): [] for p, s in chains}
        alive = list(chains)
        turn = 0
        batch_size = getattr(self.m.backends[d.backend], "batch_size", 8)
        while alive:
            todo = []
            for p, s in alive:
                if turn >= n_turns(p, d.turns):
                    continue
                key = Key(d.name, p.id, s, turn)
                if key in answers:
                    own[(p.id, s)].append(answer_message(_view(answers[key], self.bound)))
                else:
                    todo.append(
                        self.request(d, p, s, turn, turn_messages(p, d.turns, turn, own[(p.id, s)]))
                    )
            todo.sort(key=lambda r: len(r.prompt_ids))  # similar lengths pad less
            for i in range(0, len(todo), batch_size):
                batch = todo[i : i + batch_size]
                outs = await backend.run_batch(
                    batch, lambda r, f: self.on_failure(bars, r, f, backend.name)
                )
                for req, c in zip(batch, outs, strict=True):
                    if c is not None:
                        self.store(bars, req, c, backend)
                        own[(req.key.prompt_id, req.key.sample_idx)].append(answer_message(c.view))
            turn += 1
            alive = [
                (p, s)
                for p, s in alive
                if turn < n_turns(p, d.turns) and len(own[(p.id, s)]) == turn
            ]

    # --- tokens stage --------------------------------------------------------------------------
    def conversations(
        self, d: DatasetCfg
    ) -> Iterator[tuple[Key, Prompt, tuple[Message, ...], StoredResponse, ApiView]]:
        """Every stored answer with the conversation it answered (on-policy history rebuilt)."""
        prompts = {p.id: p for p in self.ledger.prompts(d.name)}
        by_chain: dict[tuple[str, int], dict[int, StoredResponse]] = {}
        for k, stored in self.ledger.responses(d.name).items():
            by_chain.setdefault((k.prompt_id, k.sample_idx), {})[k.turn] = stored
        for (pid, s), turns in sorted(by_chain.items()):
            p = prompts[pid]
            own: list[Message] = []
            for t in range(n_turns(p, d.turns)):
                r = turns.get(t)
                if r is None:
                    break
                view = _view(r, self.bound)
                msgs = turn_messages(p, d.turns, t, own)
                own.append(answer_message(view))
                yield Key(d.name, pid, s, t), p, msgs, r, view

    def make_samples(self, d: DatasetCfg) -> dict[str, Any]:
        """Exact ids where the backend gave them, reconstructed otherwise; drops by reason."""
        counts: Counter[str] = Counter()
        drops: Counter[str] = Counter()
        opts = {} if self.m.target.thinking is None else {"thinking": self.m.target.thinking}
        with self.ledger.tx():
            for key, p, msgs, r, view in self.conversations(d):
                try:
                    sample = self.sample(p, msgs, r, view, opts)
                except ReconstructError as e:
                    drops[e.reason] += 1
                    self.ledger.put_drop(key, "tokens", e.reason)
                    continue
                except DraftdataError as e:
                    drops[type(e).__name__] += 1
                    self.ledger.put_drop(key, "tokens", type(e).__name__)
                    continue
                counts[sample.token_source] += 1
                self.ledger.put_sample(
                    key,
                    sample.token_source,
                    sample.finish_reason,
                    sample.input_ids,
                    sample.prompt_len,
                    sample.warnings,
                )
        return {"samples": dict(counts), "drops": dict(drops)}

    def sample(
        self,
        p: Prompt,
        msgs: tuple[Message, ...],
        r: StoredResponse,
        view: ApiView,
        opts: dict[str, Any],
    ) -> Any:
        from ..records import Sample

        if r.output_ids is None and not (view.content or view.reasoning or view.tool_calls):
            raise ReconstructError("the API returned an empty answer", "empty_response")
        if r.output_ids is not None:
            prompt_ids = r.our_prompt_ids or self.bound.prompt_ids(msgs, p.tools, **opts)
            out = list(r.output_ids)
            if r.finish_reason in FINISHED and (not out or out[-1] not in self.bound.stop_ids):
                out.append(self.bound.end_id)
            return Sample(
                id=f"{p.id}-{r.key.sample_idx}-{r.key.turn}",
                dataset=p.dataset,
                input_ids=prompt_ids + out,
                loss_mask=[False] * len(prompt_ids) + [True] * len(out),
                prompt_len=len(prompt_ids),
                token_source="engine",
                finish_reason=r.finish_reason,
                provenance=provenance(self.bound),
            )
        s = reconstruct(
            self.bound,
            msgs,
            view,
            tools=p.tools,
            record_id=f"{p.id}-{r.key.sample_idx}-{r.key.turn}",
            dataset=p.dataset,
            thinking=self.m.target.thinking,
            text_ids=self.text_ids,
            prompt_ids=r.our_prompt_ids,
        )
        return s


def _view(r: StoredResponse, bound: BoundFormat) -> ApiView:
    """The answer as text: from the stored API response, or derived from exact engine ids."""
    from ..measure.validate import derive_view
    from ..records.wire import view_from_record

    if "choices" in r.response:
        v = view_from_record(r.response)
        if v is not None:
            return v
    if r.output_ids is not None:
        return derive_view(bound, r.output_ids, r.finish_reason)
    raise GenerateError(f"stored response for {r.key} has neither choices nor ids")
