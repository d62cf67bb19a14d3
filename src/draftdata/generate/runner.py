"""Generation at scale: prompts -> backend -> ledger, resumable and within budget; then the tokens
stage turns every stored answer into a sample.

Resume is the same command again: only (prompt, sample, turn) keys with no stored response are
asked for. With ``turns = "all"`` every user turn is answered given the model's own earlier
answers (on-policy multi-turn regeneration)."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from rich.console import Console

from ..errors import DraftdataError, GenerateError, ReconstructError
from ..formats import BoundFormat, derive_view, get_format
from ..manifest import DatasetCfg, Manifest
from ..records import ApiView, Completion, FailedAttempt, Key, Message, Prompt, StoredResponse
from ..records.wire import view_from_record
from ..sources import read_prompts
from ..store.ledger import Ledger
from ..store.stats import status
from ..tokenizers import load_tokenizer
from ..tokens.reconstruct import TextIds
from ..tokens.stage import TokensStage
from .backends import make_backend
from .backends.base import Backend, GenRequest
from .budget import Budget
from .conversation import answer_message, n_turns, sample_seed, tools_as_system, turn_messages
from .progress import Bars


@dataclass(frozen=True)
class Answered:
    """One stored answer with the conversation it answered."""

    key: Key
    prompt: Prompt
    messages: tuple[Message, ...]
    stored: StoredResponse
    view: ApiView


@dataclass(frozen=True)
class Tokenized:
    """What the tokens stage made of one dataset's answers in this pass."""

    samples: dict[str, int]  # token source -> samples
    drops: dict[str, int]  # reason -> answers


@dataclass
class RunReport:
    datasets: dict[str, Tokenized] = field(default_factory=dict)
    budget_stopped: bool = False
    spent_usd: float = 0.0


class Runner:
    def __init__(
        self,
        manifest: Manifest,
        *,
        quiet: bool = False,
        console: Console | None = None,
        command_line: list[str] | None = None,
        progress_every: float = 30.0,
    ) -> None:
        self.m = manifest
        self.quiet = quiet
        self.progress_every = progress_every
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
        self.text_ids: TextIds | None = None
        if t.prefs:
            from ..tokens.prefs import SplitPrefs

            prefs_path = manifest.resolve(t.prefs)
            prefs = SplitPrefs.load(prefs_path)
            prefs.check_tokenizer(tok, prefs_path)
            self.text_ids = prefs.applier(tok)
        self.budget = Budget(manifest.run.budget_usd, spent=status(self.ledger).cost_usd)
        self.ledger.set_meta(
            "manifest", manifest.model_dump(mode="json", exclude={"base_dir", "path"})
        )
        self.ledger.set_meta("manifest_base_dir", str(manifest.base_dir))
        if command_line is not None:  # what the report shows as the command that made the run
            self.ledger.set_meta("command_line", command_line)

    @property
    def tokens(self) -> TokensStage:
        """The tokens stage as configured now (learned preferences may be set after start)."""
        return TokensStage(self.bound, self.m.target.thinking, self.text_ids)

    # --- setup ---------------------------------------------------------------------------
    def backend(self, name: str) -> Backend:
        if name not in self.backends:
            self.backends[name] = make_backend(name, self.m.backends[name], self.m, self.bound)
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
        return GenRequest(
            Key(d.name, p.id, s, turn),
            msgs,
            p.tools,
            self.tokens.render_prompt(msgs, p),
            d.sampling,
            sample_seed(d.sampling.seed, p.id, s, turn),
        )

    # --- recording -----------------------------------------------------------------------------
    def on_failure(self, bars: Bars, req: GenRequest, f: FailedAttempt, backend: str) -> None:
        self.ledger.record_failure(req.key, backend, f)
        bars.update(req.key.dataset, errors=1, done=int(f.final))

    def store(self, bars: Bars, req: GenRequest, c: Completion, backend: Backend) -> None:
        self.ledger.record_answer(req.key, backend.name, c, req.prompt_ids)
        self.budget.charge(c.cost_usd)
        bars.update(req.key.dataset, done=1, tokens=c.completion_tokens or 0, cost=c.cost_usd)

    # --- running -------------------------------------------------------------------------------
    async def run(self, names: Iterable[str] | None = None) -> RunReport:
        chosen = [self.m.dataset(n) for n in names] if names else list(self.m.datasets)
        rep = RunReport()
        with Bars(self.quiet, self.console, self.progress_every) as bars:
            try:
                for d in chosen:
                    await self.run_dataset(d, bars)
            finally:
                for b in self.backends.values():
                    await b.aclose()
                self.backends.clear()  # their locks and sessions belong to this event loop
        for d in chosen:
            rep.datasets[d.name] = self.make_samples(d)
        rep.budget_stopped = self.budget.hit
        rep.spent_usd = self.budget.spent
        return rep

    async def run_dataset(self, d: DatasetCfg, bars: Bars) -> None:
        prompts = self.prompts(d)
        pending = self.ledger.pending(d.name)
        total = sum(n_turns(p, d.turns) for p in prompts) * d.samples_per_prompt
        backend = self.backend(d.backend) if pending else None  # refuses a bad config first
        bars.add(d.name, total, total - len(pending))
        if backend is None:
            return
        answers = self.ledger.responses(d.name)
        chains = [
            (p, s)
            for p in prompts
            for s in range(d.samples_per_prompt)
            if any(Key(d.name, p.id, s, t) in pending for t in range(n_turns(p, d.turns)))
        ]
        if backend.batches_turns:
            await self.rounds(d, chains, backend, answers, bars)
            return
        # a pool of workers pulls conversations: memory stays O(concurrency), and requests
        # start streaming at once instead of after every prompt has been rendered
        queue = deque(chains)

        async def worker() -> None:
            while queue and not self.budget.hit:
                p, s = queue.popleft()
                await self.chain(d, p, s, backend, answers, bars)

        await asyncio.gather(*(worker() for _ in range(min(backend.concurrency, len(chains)))))

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
                own.append(answer_message(self.view(answers[key])))
                continue
            req = self.request(d, p, s, t, turn_messages(p, d.turns, t, own))
            est = self.budget.reserve(backend.max_cost(req))
            if est is None:
                return  # scheduling stops before the budget could be passed
            try:
                [c] = await backend.run_batch(
                    [req], lambda r, f: self.on_failure(bars, r, f, backend.name)
                )
            finally:
                self.budget.release(est)
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
        while alive:
            todo = []
            for p, s in alive:
                if turn >= n_turns(p, d.turns):
                    continue
                key = Key(d.name, p.id, s, turn)
                if key in answers:
                    own[(p.id, s)].append(answer_message(self.view(answers[key])))
                else:
                    todo.append(
                        self.request(d, p, s, turn, turn_messages(p, d.turns, turn, own[(p.id, s)]))
                    )
            todo.sort(key=lambda r: len(r.prompt_ids))  # similar lengths pad less
            for i in range(0, len(todo), backend.batch_size):
                batch = todo[i : i + backend.batch_size]
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
    def view(self, r: StoredResponse) -> ApiView:
        """The answer as text: from the stored API response, or derived from exact engine ids."""
        if "choices" in r.response:
            v = view_from_record(r.response)
            if v is not None:
                return v
        if r.output_ids is not None:
            return derive_view(self.bound, r.output_ids, r.finish_reason)
        raise GenerateError(f"stored response for {r.key} has neither choices nor ids")

    def conversations(self, d: DatasetCfg) -> Iterator[Answered]:
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
                msgs = turn_messages(p, d.turns, t, own)
                try:
                    view = self.view(r)
                except DraftdataError:
                    view = ApiView(content=None, finish_reason=r.finish_reason)
                own.append(answer_message(view))
                yield Answered(Key(d.name, pid, s, t), p, msgs, r, view)

    def make_samples(self, d: DatasetCfg, *, only_missing: bool = False) -> Tokenized:
        """Every stored answer through the tokens stage: a sample, or a drop with its reason.
        ``only_missing`` keeps the samples and drops already made (export uses it, so a sample
        keeps the provenance it was made under)."""
        counts: Counter[str] = Counter()
        drops: Counter[str] = Counter()
        stage = self.tokens
        done = self.ledger.tokenized(d.name) if only_missing else set()
        with self.ledger.tx():
            for a in self.conversations(d):
                key = a.key
                if key in done:
                    continue
                try:
                    sample = stage.sample(key, a.prompt, a.messages, a.stored, a.view)
                except ReconstructError as e:
                    drops[e.reason] += 1
                    self.ledger.put_drop(key, "tokens", e.reason)
                    continue
                except DraftdataError as e:
                    drops[type(e).__name__] += 1
                    self.ledger.put_drop(key, "tokens", type(e).__name__)
                    continue
                counts[sample.token_source] += 1
                self.ledger.put_sample(key, sample)
        return Tokenized(dict(counts), dict(drops))
