"""The tokens stage of a run: every stored answer, with the conversation it answered (its
on-policy history rebuilt from the model's own answers), made into a sample or a drop.

A stage over what it reads: the run's ledger, its manifest (the datasets' turns, the backends'
servers, ``[run] drop``) and the run's target (its bound format, thinking option and learned
split preferences). Generation (``generate.runner.Runner``) and the export
(``export.run_export``) both call it; neither hands it the other."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any

from rich.console import Console
from rich.text import Text

from ..config import DatasetCfg, Manifest
from ..config.backends import answer_reader
from ..errors import DraftdataError, GenerateError
from ..formats import BoundFormat, derive_view
from ..records import Answered, ApiView, Drop, Key, Message, SampleRow, StoredResponse
from ..records.wire import view_from_record
from ..store import codec
from ..store.ledger import Ledger
from .checks import RunChecks, for_checks
from .counts import checked_counting
from .history import answer_message, n_turns, turn_messages
from .reconstruct import WINDOW
from .run_workers import jobs_for, outcomes
from .sample_maker import TokensStage
from .target import Target

#: samples written per statement by the tokens stage
SAMPLE_WRITES = 512


@dataclass(frozen=True)
class Tokenized:
    """What the tokens stage made of one dataset's answers in this pass."""

    samples: dict[str, int]  # token source -> samples
    drops: dict[str, int]  # reason -> answers


def server_of(m: Manifest, backend: str) -> str | None:
    """The server a backend's manifest names (None: auto, told from each response)."""
    cfg = m.backends.get(backend)
    server = getattr(cfg, "server", "auto")
    return None if server == "auto" else str(server)


def stored_view(m: Manifest, bound: BoundFormat, r: StoredResponse) -> ApiView:
    """The answer as text: from the stored API response, or derived from exact engine ids."""
    if r.problem is not None:  # quarantined: its body is not parsed again
        return ApiView(None, r.finish_reason)
    # each kind reads its own bodies (``BackendKind.reader``); a backend no longer in the
    # manifest is read as OpenAI's shape; a local engine's answer is its ids
    cfg = m.backends.get(r.backend)
    read = answer_reader(str(getattr(cfg, "kind", ""))) if cfg is not None else view_from_record
    v = read(r.response) if read is not None else None
    if isinstance(v, ApiView):
        server = server_of(m, r.backend)
        return v if server is None else replace(v, server=server)
    if r.output_ids is not None:
        return derive_view(bound, r.output_ids, r.finish_reason)
    raise GenerateError(
        f"stored response for {r.key}: backend {r.backend!r} left neither an answer it reads "
        "nor ids"
    )


class RunTokens:
    """The run's tokens stage over its ledger, manifest and target (its split preferences
    included); ``checks``: the run's cross-answer quality checks
    (one answer index for every dataset; made here when not given); ``console``: where the
    one-time language-check note goes (None: quiet)."""

    def __init__(
        self,
        ledger: Ledger,
        manifest: Manifest,
        target: Target,
        checks: RunChecks | None = None,
        console: Console | None = None,
    ) -> None:
        self.ledger, self.m, self.target = ledger, manifest, target
        self.bound = target.bound
        self.checks = checks if checks is not None else RunChecks(manifest.run.drop)
        self.console = console

    @property
    def stage(self) -> TokensStage:
        return TokensStage(self.target)

    def view(self, r: StoredResponse) -> ApiView:
        return stored_view(self.m, self.bound, r)

    def conversations(self, d: DatasetCfg) -> Iterator[Answered]:
        """Every stored answer with the conversation it answered (on-policy history rebuilt),
        streamed from the ledger a conversation at a time."""
        for chain in self.ledger.answers.chains(d.name):
            p, s = chain.prompt, chain.sample
            turns = {r.key.turn: r for r in chain.responses}
            own: list[Message] = []
            for t in range(n_turns(p, d.turns)):
                r = turns.get(t)
                if r is None:
                    break
                msgs = turn_messages(p, d.turns, t, own)
                try:
                    view = self.view(r)
                except (DraftdataError, AttributeError, TypeError, ValueError, RecursionError) as e:
                    # an answer stored before the wire boundary checked it: quarantined now
                    view = ApiView(content=None, finish_reason="stop")
                    r = replace(r, problem=f"unusable_message: {e}"[:200])
                own.append(answer_message(view))
                yield Answered(Key(d.name, p.id, s, t), p, msgs, r, view)

    def joined_conversations(
        self, d: DatasetCfg, drops: Counter[str], done: set[Key]
    ) -> Iterator[Answered]:
        """``turns = "joined"``: each conversation's last stored answer, whose sample trains
        every answer before it too. The samples of its earlier turns (made when it was shorter)
        are removed; one already decided (in ``done``) is passed over. A conversation with an
        earlier answer cut by ``length`` is dropped as
        ``history_truncated``: the history closes that answer with an end of turn the model
        never wrote, and it would be trained."""
        for _, chain in groupby(self.conversations(d), key=lambda a: a.key.chain):
            turns = list(chain)
            last = turns[-1]
            if last.key in done:  # decided in an earlier pass (export's only_missing)
                continue
            self.ledger.samples.forget([a.key for a in turns[:-1]])
            if any(a.stored.finish_reason == "length" for a in turns[:-1]):
                drops["history_truncated"] += 1
                self.ledger.samples.drop(last.key, "tokens", "history_truncated")
                continue
            yield last

    def make(
        self, d: DatasetCfg, *, only_missing: bool = False, jobs: int = 0, window: int = WINDOW
    ) -> Tokenized:
        """Every stored answer through the tokens stage: a sample, or a drop with its reason.
        ``only_missing`` keeps the samples and drops already made (export uses it, so a sample
        keeps the provenance it was made under). ``jobs`` workers (0: one per core for a few
        thousand answers or more, ``tokens.run_workers``); the ledger ends the same either way."""
        counts: Counter[str] = Counter()
        drops: Counter[str] = Counter()
        todo = self.ledger.samples.undecided(d.name) if only_missing else None
        if todo == 0:
            return Tokenized({}, {})  # every answer has its sample or drop: nothing to walk
        # the server's counting convention as its own ids showed it, where the run checked it
        stage = replace(self.stage, counting=checked_counting(self.ledger.meta, self.m, d.backend))
        done = self.ledger.samples.decided(d.name) if only_missing else set()
        joined = d.turns == "joined"
        if joined:
            stage = replace(stage, joined=True)
        answers = (
            a
            for a in (
                self.joined_conversations(d, drops, done) if joined else self.conversations(d)
            )
            if a.key not in done
        )
        made: list[tuple[Key, tuple[Any, ...]]] = []
        n_jobs = jobs_for(todo if todo is not None else self.ledger.answers.count(d.name), jobs)
        checks = self.checks
        loaded = checks.load_s is not None
        # answers out to the workers (two windows each), as the quality checks read them
        pending: dict[Key, Answered] = {}

        def sent() -> Iterator[Answered]:
            for a in answers:
                pending[a.key] = for_checks(a)
                yield a

        with self.ledger.tx():
            for got in outcomes(stage, sent(), codec.sample_row, n_jobs, window):
                a = pending.pop(got.key)
                if not isinstance(got, Drop):
                    got = quality(checks, a, got)
                if isinstance(got, Drop):
                    drops[got.reason] += 1
                    self.ledger.samples.drop(got.key, "tokens", got.reason)
                else:
                    counts[got.token_source] += 1
                    made.append((got.key, got.row))
                    if len(made) >= SAMPLE_WRITES:
                        self.ledger.samples.put_rows(made)
                        made.clear()
            self.ledger.samples.put_rows(made)
        if not loaded and checks.load_s is not None and self.console is not None:
            self.console.print(
                Text(f"language check: py3langid loaded in {checks.load_s:.1f} s (once per run)")
            )
        return Tokenized(dict(counts), dict(drops))


def quality(checks: RunChecks, a: Answered, got: SampleRow) -> SampleRow | Drop:
    """A sample with the cross-answer checks that fire added to its warnings, or its drop
    (``quality:<check>``) when ``[run] drop`` names one of its checks."""
    have = codec.row_warnings(got.row)
    added = [w for w in checks.across(a) if w not in have]
    warnings = (*have, *added)
    why = checks.dropped(warnings)
    if why is not None:
        return Drop(got.key, why)
    return replace(got, row=codec.with_row_warnings(got.row, warnings)) if added else got
