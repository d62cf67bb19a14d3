"""The tokens stage: every stored answer becomes a ``Sample`` here, or a counted drop.

Three sources of ids, one set of checks:

- ``engine``: the backend returned the model's exact ids. The prompt ids are the ones the server
  says it fed the model; where they differ from our rendering the sample keeps the server's
  (those are what the model answered) and carries a ``prompt_drift`` warning.
- ``logprobs``: ids looked up from the tokens a server reported with their bytes or ids.
- ``reconstructed``: the answer text laid out by the format's response grammar.

Every id must lie inside the vocabulary; an answer that finished ends with a stop id.

Each sample also carries the names of the per-answer quality checks that fire on it
(``tokens.quality.check_sample``: ``repetition_loop``, ``truncated``, ``empty_answer``,
``think_unclosed``) among its warnings; the checks across answers (``near_duplicate_answer``,
``language_mismatch``) need the run's state and are added by the run (``tokens.run_samples``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from ..errors import DraftdataError, ReconstructError
from ..formats import BoundFormat
from ..records import Answered, ApiView, Counting, Key, Message, Prompt, Sample, StoredResponse
from .counts import witness
from .quality import Markers, check_sample
from .reconstruct import WINDOW, Item, check_ids, ids_contradict, provenance
from .target import Target

#: a warning on samples whose prompt ids (the server's) differ from our rendering
PROMPT_DRIFT = "prompt_drift"
#: a window of answers closes at WINDOW answers or at this many characters of answer text,
#: whichever comes first: 512 Kimi answers of reasoning and content held ~75 MB of parsed
#: bodies in each worker and five windows in the parent (the 10k rehearsal's tokens stage)
WINDOW_CHARS = 1 << 21


def windows(answers: Iterable[Answered], most: int = WINDOW) -> Iterator[list[Answered]]:
    """``answers`` in lists of at most ``most`` answers and about ``WINDOW_CHARS`` characters
    of answer text (one answer longer than that is a window of its own)."""
    chunk: list[Answered] = []
    chars = 0
    for a in answers:
        chunk.append(a)
        chars += len(a.view.content or "") + len(a.view.reasoning or "")
        if len(chunk) >= most or chars >= WINDOW_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


@dataclass(frozen=True)
class TokensStage:
    """Stored answers to samples with the run's ``target`` (prompts rendered with its options,
    text encoded with its split preferences)."""

    target: Target
    #: every assistant turn of the answer's conversation trained in its sample (``tokens.turns``)
    joined: bool = False
    #: add the names of the per-answer quality checks that fire to each sample's warnings
    quality: bool = True
    #: how the server counts its ``usage``, where the run checked it on the server's own ids
    #: (``tokens.counts``); None: as each answer's server profile declares
    counting: Counting | None = None

    def markers(self) -> Markers:
        """The control ids the quality checks read, from the bound format."""
        ids = self.bound.ids
        return Markers(self.bound.stop_ids, ids.get("think_open"), ids.get("think_close"))

    def with_quality(self, s: Sample, view: ApiView) -> Sample:
        """``s`` with the names of the quality checks that fire on it added to its warnings."""
        if not self.quality:
            return s
        fired = [w for w in check_sample(s, view, self.markers()) if w not in s.warnings]
        return replace(s, warnings=s.warnings + tuple(fired)) if fired else s

    @property
    def bound(self) -> BoundFormat:
        return self.target.bound

    def render_prompt(self, messages: Sequence[Message], prompt: Prompt) -> list[int]:
        return self.target.prompt_ids(messages, prompt.tools)

    def render_prompts(
        self, todo: Sequence[tuple[Sequence[Message], Prompt]]
    ) -> list[list[int] | None]:
        """``render_prompt`` for many prompts in one batched encode; None where one cannot be
        rendered (its caller renders it alone, to quarantine it with the reason)."""
        got = self.target.prompt_ids_many([(m, p.tools) for m, p in todo])
        return [None if isinstance(g, DraftdataError) else g for g in got]

    def sample(
        self,
        key: Key,
        prompt: Prompt,
        messages: Sequence[Message],
        stored: StoredResponse,
        view: ApiView,
    ) -> Sample:
        """The sample for one stored answer; a ReconstructError (with its reason) otherwise."""
        ((_, got),) = self.samples([Answered(key, prompt, tuple(messages), stored, view)])
        if isinstance(got, DraftdataError):
            raise got
        return got

    def samples(
        self, answers: Iterable[Answered], window: int = WINDOW
    ) -> Iterator[tuple[Key, Sample | DraftdataError]]:
        """``sample`` over a stream of stored answers, in order, each with its key: the sample,
        or the error that made the answer unusable. Answers given as text are encoded in one
        batched call per window (``windows``: ``window`` answers at most)."""
        for chunk in windows(answers, window):
            first: list[Sample | Item | DraftdataError] = []
            for a in chunk:
                try:
                    first.append(
                        self._engine_or_item(a.key, a.prompt, a.messages, a.stored, a.view)
                    )
                except DraftdataError as e:
                    first.append(e)
            items = [x for x in first if isinstance(x, Item)]
            made = iter(self.target.reconstruct_many(items, window=max(len(items), 1)))
            for a, x in zip(chunk, first, strict=True):
                if isinstance(x, Item):
                    x = self._as_engine(a.stored, self._checked(a.key, next(made)))
                yield a.key, x if isinstance(x, DraftdataError) else self.with_quality(x, a.view)

    def _as_engine(
        self, stored: StoredResponse, s: Sample | DraftdataError
    ) -> Sample | DraftdataError:
        """A joined sample of exact engine answers: kept only where its ids are the engine's
        own (its last prompt and answer), and then labelled so."""
        if stored.output_ids is None or isinstance(s, DraftdataError):
            return s
        prompt = stored.server_prompt_ids or stored.our_prompt_ids or ()
        exact = list(prompt) + self.bound.closed(list(stored.output_ids), stored.finish_reason)
        if s.input_ids != exact:
            return ReconstructError(
                "the joined conversation's ids are not the engine's own ids for its last turn",
                "joined_not_engine_exact",
            )
        return replace(s, token_source="engine")

    def _engine_or_item(
        self,
        key: Key,
        prompt: Prompt,
        messages: Sequence[Message],
        stored: StoredResponse,
        view: ApiView,
    ) -> Sample | Item:
        if stored.problem is not None:
            kind = stored.problem.split(":", 1)[0]
            raise ReconstructError(f"quarantined: {stored.problem}", f"quarantined:{kind}")
        ours = (
            list(stored.our_prompt_ids)
            if stored.our_prompt_ids is not None
            else self.render_prompt(messages, prompt)
        )
        if stored.output_ids is not None and not self.joined:
            given = check_ids(self.bound, stored.output_ids, "output_ids")
            if (why := ids_contradict(self.bound, given, view)) is not None:
                raise ReconstructError(why, "ids_contradict_text")  # never exported as engine
            return self._engine(key, prompt, ours, stored, given, view)
        if not (view.content or view.reasoning or view.tool_calls):
            raise ReconstructError("the API returned an empty answer", "empty_response")
        if self.joined:  # the whole conversation is laid out: no prompt ids are taken as given
            return Item(messages, view, prompt.tools, key.sample_id, prompt.dataset, None, True)
        return Item(
            messages,
            view,
            prompt.tools,
            key.sample_id,
            prompt.dataset,
            ours,
            counting=self.counting,
        )

    def _checked(self, key: Key, s: Sample | DraftdataError) -> Sample | DraftdataError:
        if isinstance(s, DraftdataError):
            return s
        try:
            check_ids(self.bound, s.input_ids, "sample")
        except DraftdataError as e:
            return e
        return replace(s, key=key)

    def _engine(
        self,
        key: Key,
        prompt: Prompt,
        ours: list[int],
        stored: StoredResponse,
        output_ids: Sequence[int],
        view: ApiView,
    ) -> Sample:
        out = self.bound.closed(
            check_ids(self.bound, output_ids, "output_ids"), stored.finish_reason
        )
        warnings: tuple[str, ...] = ()
        prompt_ids = ours
        if stored.server_prompt_ids is not None:
            theirs = check_ids(self.bound, stored.server_prompt_ids, "prompt_token_ids")
            if theirs != ours:
                prompt_ids, warnings = theirs, (PROMPT_DRIFT,)
        counted = witness(self.bound, prompt_ids + out, len(prompt_ids), view, self.counting)
        warnings += counted
        return Sample(
            id=key.sample_id,
            key=key,
            dataset=prompt.dataset,
            input_ids=prompt_ids + out,
            loss_mask=[False] * len(prompt_ids) + [True] * len(out),
            prompt_len=len(prompt_ids),
            token_source="engine",
            finish_reason=stored.finish_reason,
            provenance=provenance(self.bound),
            warnings=warnings,
        )
