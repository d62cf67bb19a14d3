"""Generation at scale: prompts -> backend -> ledger, resumable and within budget; then the tokens
stage turns every stored answer into a sample.

Resume is the same command again: only (prompt, sample, turn) keys with no stored response are
asked for. With ``turns = "all"`` every user turn is answered given the model's own earlier
answers (on-policy multi-turn regeneration)."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.text import Text

from ..config import DatasetCfg
from ..errors import DraftdataError
from ..measure.contamination import Tally
from ..records import ApiView, Completion, FailedAttempt, Key, Message, Prompt, StoredResponse
from ..session import Run
from ..store.guard import LedgerFull
from ..store.meta import READ_DROPS
from ..store.stats import status
from ..tokens.history import answer_message, n_turns, turn_messages
from ..tokens.run_samples import Tokenized, stored_view
from ..tokens.sample_maker import TokensStage
from .backends import make_backend
from .backends.base import Backend, BudgetRefused, GenRequest
from .backends.retry import PROBE_REFUSED
from .budget import Budget
from .chains import PROMPT_WINDOW, Chain, chain_pages, first_prompts
from .commits import GroupCommit
from .contaminated import DecontaminateMixin
from .contract import Serving, check_dataset, over_context
from .count_watch import CountWatch
from .inputs import DUPLICATE, drop_reason, first_turn_ids, iter_dataset, no_prompts
from .progress import Bars
from .requests import sample_seed

#: a Retry-After this long is said in the progress output
LONG_WAIT_S = 10.0


@dataclass
class RunReport:
    datasets: dict[str, Tokenized] = field(default_factory=dict)
    budget_stopped: bool = False
    spent_usd: float = 0.0
    #: datasets stopped because no retry could help (a refused key), with the reason
    stopped: dict[str, str] = field(default_factory=dict)
    #: the datasets asked for, in order
    chosen: list[str] = field(default_factory=list)


class Runner(DecontaminateMixin):
    """Generation over a run opened to write (``session.Run``, which admitted this writer):
    the answers still missing, asked within the budget and stored as they arrive. It makes no
    samples and decides nothing else: the stages around it are ``pipeline``'s."""

    def __init__(
        self,
        run: Run,
        *,
        quiet: bool = False,
        console: Console | None = None,
        progress_every: float = 30.0,
        extend: bool = False,
    ) -> None:
        """``run``: the run folder as its caller opened it to write (the caller closes it);
        ``extend``: a dataset's ``limit`` grew (``--extend``), its new prompts are asked."""
        self.m = manifest = run.manifest
        self.run = run
        self.quiet = quiet
        self.progress_every = progress_every
        self.console = console or Console(stderr=True)
        self.ledger = run.ledger
        self.commits = GroupCommit.for_run(self.ledger, manifest)
        self.target, self.bound = run.target, run.target.bound
        self.backends: dict[str, Backend] = {}
        #: what each server says it serves (engine, context), asked once, before any request
        self.serving = Serving(manifest)
        #: datasets whose prompt rendering was checked against their server in this process
        self.contract_checked: set[str] = set()
        #: the run's cross-answer quality checks (one answer index for every dataset)
        self.checks = run.checks
        #: the count witness's gate on text-only datasets (``generate.count_watch``)
        self.watch = CountWatch(manifest, self.ledger, self.tokens)
        # what the ledger holds as spent, the requests a killed writer left in flight included
        # (settled as possibly paid when the run admitted this writer)
        spent = status(self.ledger).cost_usd + self.ledger.answers.possibly_paid()
        self.budget = Budget(manifest.run.budget_usd, spent=spent)
        self.extend = extend
        #: datasets whose source file changed since the run began: read again
        self.reread = run.reread

    def close(self) -> None:
        """Write what is still waiting to be committed (the run itself is its opener's to
        close)."""
        self.commits.close()

    @property
    def tokens(self) -> TokensStage:
        """The tokens stage as prompts are rendered with the run's target."""
        return TokensStage(self.target)

    def view(self, r: StoredResponse) -> ApiView:
        return stored_view(self.m, self.bound, r)

    # --- setup ---------------------------------------------------------------------------
    def backend(self, name: str) -> Backend:
        if name not in self.backends:
            b = make_backend(name, self.m.backends[name], self.m, self.bound)

            async def before_send(req: GenRequest) -> int:
                # a retry after an attempt that may have been paid reserves again, or is not
                # sent (the key stays pending); a request is written before it leaves, at what
                # it may cost: a kill in flight leaves it counted as possibly paid
                cost, worst = b.max_cost(req), self.uncharged_worst(req, b) or 0.0
                if not self.budget.reserve_again(req.key, cost, worst):
                    raise BudgetRefused(req.key.sample_id)
                return await self.commits.begin(
                    req.key, name, max(cost * self.budget.overspend, worst)
                )

            b.before_send = before_send
            self.backends[name] = b
        return self.backends[name]

    def prompts(self, d: DatasetCfg) -> int:
        """The dataset's prompts into the ledger (read from its source the first time, streamed:
        memory holds one prompt); returns how many the ledger holds."""
        stored = self.ledger.prompts.count(d.name)
        fresh = d.name in self.reread
        if stored and not fresh and not (self.extend and (d.limit is None or d.limit > stored)):
            return stored
        drops: Counter[str] = Counter()
        # a prompt already in an earlier dataset of this run is dropped here, and counted
        earlier = self.ledger.prompts.ids(exclude=d.name)
        dups: set[str] = set()

        det = self.decontaminator()
        tally = Tally()

        def kept(ps: Iterable[Prompt]) -> Iterator[Prompt]:
            for p in ps:
                why = drop_reason(p, earlier, det, tally)
                if why is None:
                    yield p
                    continue
                drops[why] += 1
                if why == DUPLICATE:
                    dups.add(p.id)

        turns = lambda p: n_turns(p, d.turns)  # noqa: E731
        # each prompt's first turn is rendered as it is stored, a chunk at a time
        how = (d.samples_per_prompt, turns, lambda ps: first_turn_ids(self.tokens, d, ps))
        if fresh:  # the source changed: answered prompts stay, unanswered ones follow the file
            n_kept, gone, added = self.ledger.prompts.replace_unanswered(
                d.name, list(kept(iter_dataset(self.m, d, drops))), *how
            )
            self.reread.discard(d.name)
            self.console.print(
                Text(
                    f"{d.name}: {d.source} changed since the run began; read again: {added} "
                    f"new prompts, {gone} unanswered prompts no longer in it, {n_kept} answered "
                    "prompts kept"
                )
            )
            self.ledger.meta.put(READ_DROPS.of(d.name), dict(drops))
            self.record_contamination(d, tally, det is not None)
            return self.ledger.prompts.count(d.name)
        # --extend: the prompts already there keep their place; new ones follow
        have = self.ledger.prompts.ids_of(d.name) if stored else set()
        new = (p for p in kept(iter_dataset(self.m, d, drops)) if p.id not in have)
        added = self.ledger.prompts.add(d.name, new, *how[:2], start=stored, render=how[2])
        if not stored + added:
            raise no_prompts(self.m, d, self.ledger, dups, drops)
        self.ledger.meta.put(READ_DROPS.of(d.name), dict(drops))
        self.record_contamination(d, tally, det is not None)
        return stored + added

    def request(
        self,
        d: DatasetCfg,
        p: Prompt,
        s: int,
        turn: int,
        msgs: tuple[Message, ...],
        prompt_ids: Sequence[int] | None = None,
    ) -> GenRequest:
        return GenRequest(
            Key(d.name, p.id, s, turn),
            msgs,
            p.tools,
            list(prompt_ids) if prompt_ids is not None else self.tokens.render_prompt(msgs, p),
            d.sampling,
            sample_seed(d.sampling.seed, p.id, s, turn),
        )

    def safe_request(
        self,
        d: DatasetCfg,
        p: Prompt,
        s: int,
        turn: int,
        own: list[Message],
        prompt_ids: Sequence[int] | None = None,
    ) -> GenRequest | None:
        """The request, or None when its prompt cannot be rendered: the key is quarantined with
        the reason, so this run and every rerun go on past it. ``prompt_ids``: the prompt's ids
        when they were rendered ahead (in a batch)."""
        try:
            msgs = turn_messages(p, d.turns, turn, own)
            return self.request(d, p, s, turn, msgs, prompt_ids)
        except (DraftdataError, TypeError, ValueError, AttributeError) as e:
            why = f"unrenderable_prompt: {type(e).__name__}: {e}"
            self.ledger.answers.quarantine(Key(d.name, p.id, s, turn), why[:500])
            return None

    # --- recording -----------------------------------------------------------------------------
    def on_failure(self, bars: Bars, req: GenRequest, f: FailedAttempt, backend: str) -> None:
        charged = None
        if f.paid_usd is not None:  # it may have been paid: charged now, its reservation gone
            charged = self.budget.charge_unanswered(req.key, f.paid_usd, f.settled)
            bars.update(req.key.dataset, cost=charged)
        try:
            self.ledger.answers.record_failure(req.key, backend, f, charged)
        except LedgerFull as e:  # its intent stays open: the next run counts it possibly paid
            self.commits.stall(e)
        self.commits.settled(f.intent)  # its request is no longer in flight
        # the capability probe's expected refusal is recorded, but it is not an error
        bars.update(req.key.dataset, errors=int(f.reason != PROBE_REFUSED), done=int(f.final))
        if f.asked_s is not None and f.asked_s >= LONG_WAIT_S:
            capped = "" if f.asked_s <= f.wait_s else f" (capped from the {f.asked_s:,.0f} s asked)"
            bars.note(
                f"{req.key.dataset}: the server asked to wait before retrying (Retry-After); "
                f"waiting {f.wait_s:.0f} s{capped}"
            )

    async def store(
        self, bars: Bars, req: GenRequest, c: Completion, backend: Backend, estimate: float
    ) -> None:
        """An answer: charged the moment it arrives (it is paid for), counted done once the
        group holding it is committed."""
        self.budget.charge(c.cost_usd, estimate)
        await self.commits.put((req.key, backend.name, c, req.prompt_ids))
        self.counted(bars, req, c)
        self.watch.see(self.m.dataset(req.key.dataset), req, c)

    def counted(self, bars: Bars, req: GenRequest, c: Completion) -> None:
        bars.update(req.key.dataset, done=1, tokens=c.completion_tokens or 0, cost=c.cost_usd)

    # --- running -------------------------------------------------------------------------------
    async def generate(self, names: Iterable[str] | None = None) -> RunReport:
        """Ask for every answer still missing in the named datasets (all: None), within the
        budget; the report's ``datasets`` stay empty (no samples are made here)."""
        chosen = [self.m.dataset(n) for n in names] if names else list(self.m.datasets)
        rep = RunReport(chosen=[d.name for d in chosen])
        with Bars(self.quiet, self.console, self.progress_every) as bars:
            runs: list[asyncio.Task[None]] = []
            self.commits.say = bars.note  # a full disk's wait, said where the progress goes
            try:
                for d in chosen:
                    # the next dataset starts once this one has handed out its last
                    # conversation: its tail overlaps the next one's start (the backend's
                    # concurrency still bounds what is in flight), not a drained pool
                    drained = asyncio.Event()
                    runs.append(asyncio.create_task(self.run_dataset(d, bars, drained)))
                    waiting = asyncio.create_task(drained.wait())
                    await asyncio.wait((runs[-1], waiting), return_when=asyncio.FIRST_COMPLETED)
                    waiting.cancel()
                    if runs[-1].done():
                        runs[-1].result()  # its error, raised here
                await asyncio.gather(*runs)
                for d in chosen:
                    fatal = self.backends[d.backend].fatal if d.backend in self.backends else None
                    if fatal or d.name in self.watch.stopped:
                        rep.stopped[d.name] = fatal or self.watch.stopped[d.name]
            finally:
                for t in runs:
                    t.cancel()
                await asyncio.gather(*runs, return_exceptions=True)
                self.commits.flush()  # answers that arrived before a stop are kept
                for b in self.backends.values():
                    await b.aclose()
                self.backends.clear()  # their locks and sessions belong to this event loop
        rep.budget_stopped = self.budget.hit
        rep.spent_usd = self.budget.spent
        return rep

    async def run_dataset(
        self, d: DatasetCfg, bars: Bars, drained: asyncio.Event | None = None
    ) -> None:
        """Every answer the dataset still lacks; ``drained`` is set once its last conversation
        is taken (or it ends), when the next dataset may start beside its tail."""
        drained = drained or asyncio.Event()
        try:
            await self._run_dataset(d, bars, drained)
        finally:
            drained.set()

    async def _run_dataset(self, d: DatasetCfg, bars: Bars, drained: asyncio.Event) -> None:
        self.prompts(d)
        total, todo = self.ledger.prompts.work_counts(d.name)
        backend = self.backend(d.backend) if todo else None  # refuses a bad config first
        bars.add(d.name, total, total - todo)
        if todo and self.serving.engine(d) is None:
            self.watch.start(d)
        if backend is None or d.name in self.watch.stopped:
            return
        self.check_contract(d)
        if backend.batches_turns:
            chains = [c for page in chain_pages(self.ledger, d) for c in page]
            await self.rounds(d, chains, backend, bars)
            return
        # a pool of workers pulls conversations a page at a time from the ledger: memory stays
        # O(concurrency + one page) whatever the dataset's size, and requests start at once
        pages = chain_pages(self.ledger, d)
        ready: deque[Chain] = deque()

        # the next page is taken as the last conversation is, not when a worker comes back: a
        # resumed dataset of a few leftover keys held the next one back by a whole answer
        def refill() -> None:
            page = next(pages, None)
            if page is None:
                drained.set()
            else:
                ready.extend(first_prompts(self.tokens, d, page))

        async def worker() -> None:
            while not (self.budget.hit or backend.fatal or d.name in self.watch.stopped):
                if not ready and not drained.is_set():
                    refill()
                if not ready:
                    return
                c = ready.popleft()
                if not ready and not drained.is_set():
                    refill()
                await self.chain(d, c, backend, bars)

        await asyncio.gather(*(worker() for _ in range(min(backend.concurrency, todo))))

    def check_contract(self, d: DatasetCfg) -> None:
        """Before the dataset's first request (once): our prompt ids against the server's own
        rendering, on a sample of the prompts still to ask (``contract.check_dataset``)."""
        if d.name not in self.contract_checked and self.serving.renders(d):
            self.contract_checked.add(d.name)
            page = self.ledger.prompts.pending_chains(d.name, -1, PROMPT_WINDOW)
            line = check_dataset(self.serving, d, self.target, (c.prompt for c in page.chains))
            if line and not self.quiet:
                self.console.print(Text(line))

    def fits(self, d: DatasetCfg, req: GenRequest) -> bool:
        """A prompt that leaves no room for max_tokens in the server's context is skipped as
        over_context: never sent, never paid, counted with the reason."""
        why = over_context(self.serving.context(d), len(req.prompt_ids), req.sampling.max_tokens)
        if why is not None:
            self.ledger.answers.quarantine(req.key, why)
        return why is None

    async def chain(self, d: DatasetCfg, c: Chain, backend: Backend, bars: Bars) -> None:
        """One conversation, turn by turn (each turn waits for the model's previous answer)."""
        p, s = c.prompt, c.sample
        own: list[Message] = []
        for t in range(n_turns(p, d.turns)):
            if t in c.answers:
                own.append(answer_message(self.view(c.answers[t])))
                continue
            req = self.safe_request(d, p, s, t, own, c.first_ids if t == 0 else None)
            if req is None or not self.fits(d, req):
                return  # quarantined: later turns cannot be asked without this one
            got = await self.within_budget(bars, req, backend)
            if got is None:
                return  # failed (recorded) or over budget: later turns wait for this one
            own.append(answer_message(got.view))

    async def within_budget(
        self, bars: Bars, req: GenRequest, backend: Backend
    ) -> Completion | None:
        """``ask``, alone while the budget says so (a capped run's first answer, the last before
        the cap); one that waited looks again: the first answer frees the wave queued behind.
        Before any answer is charged, a backend that bounds what a request can cost (a stream
        hung up on past the runaway limit) reserves that bound and goes at full concurrency."""
        estimate, worst = backend.max_cost(req), self.uncharged_worst(req, backend)
        most = max(estimate, worst or 0.0)
        serial = self.budget.serial_lock(most, backend.concurrency, bounded=worst is not None)
        if serial is not None:
            async with serial:
                worst = self.uncharged_worst(req, backend)
                again = self.budget.serial_lock(most, backend.concurrency, worst is not None)
                if again is not None:
                    return await self.ask(bars, req, backend, estimate, worst or 0.0)
        return await self.ask(bars, req, backend, estimate, worst or 0.0)

    def uncharged_worst(self, req: GenRequest, backend: Backend) -> float | None:
        """What the request can cost at worst, while the budget has charged no answer yet."""
        return None if self.budget.calibrated else backend.worst_cost(req)

    async def ask(
        self, bars: Bars, req: GenRequest, backend: Backend, estimate: float, worst: float = 0.0
    ) -> Completion | None:
        """One request within the budget: ``estimate`` (at least ``worst``) reserved before,
        charged after."""
        if not await self.budget.hold(req.key, estimate, worst):
            return None  # scheduling stops before the budget could be passed
        try:
            [c] = await backend.run_batch(
                [req], lambda r, f: self.on_failure(bars, r, f, backend.name)
            )
        finally:
            self.budget.let_go(req.key)
        if c is not None:
            await self.store(bars, req, c, backend, estimate)
        return c

    async def rounds(
        self, d: DatasetCfg, chains: list[Chain], backend: Backend, bars: Bars
    ) -> None:
        """Local engines: every conversation's turn t in batches, then turn t+1."""
        own: dict[tuple[str, int], list[Message]] = {(c.prompt.id, c.sample): [] for c in chains}
        alive = list(chains)
        turn = 0
        while alive:
            todo = []
            for c in alive:
                p, s = c.prompt, c.sample
                if turn >= n_turns(p, d.turns):
                    continue
                if turn in c.answers:
                    own[(p.id, s)].append(answer_message(self.view(c.answers[turn])))
                else:
                    first = c.first_ids if turn == 0 else None
                    req = self.safe_request(d, p, s, turn, own[(p.id, s)], first)
                    if req is not None:
                        todo.append(req)
            todo.sort(key=lambda r: len(r.prompt_ids))  # similar lengths pad less
            for i in range(0, len(todo), backend.batch_size):
                batch = todo[i : i + backend.batch_size]
                outs = await backend.run_batch(
                    batch, lambda r, f: self.on_failure(bars, r, f, backend.name)
                )
                got = [(r, a) for r, a in zip(batch, outs, strict=True) if a is not None]
                self.commits.put_now([(r.key, backend.name, a, r.prompt_ids) for r, a in got])
                for req, a in got:
                    self.budget.charge(a.cost_usd)
                    self.counted(bars, req, a)
                    own[(req.key.prompt_id, req.key.sample_idx)].append(answer_message(a.view))
            turn += 1
            alive = [
                c
                for c in alive
                if turn < n_turns(c.prompt, d.turns) and len(own[(c.prompt.id, c.sample)]) == turn
            ]
