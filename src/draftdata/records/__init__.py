"""Typed records passed between stages: frozen dataclasses, no untyped dicts between stages.

The flow, and the record each stage hands to the next::

    sources -> Prompt -> generate -> Completion -> store -> StoredResponse -> tokens -> Sample
    ground truth (files, or a run's exact answers) -> GroundTruth -> measure -> ValidationResult

Two serialisers exist for these records: ``records.wire`` (the OpenAI wire format, both ways) and
the ledger's own (``store.codec`` for its tables; ``store.meta`` for the records of
``records.meta`` that one stage leaves another in its meta table). Raw API payloads
(``Completion.response``) stay the provider's JSON, stored verbatim; everything derived from
them is typed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .counting import Counting as Counting  # a server profile's field, importable from here

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

Role = Literal["system", "user", "assistant", "tool"]
TokenSource = Literal["engine", "logprobs", "reconstructed", "repaired"]

#: finish reasons after which the model wrote its end-of-turn marker
FINISHED = frozenset({"stop", "tool_calls", "function_call"})


@dataclass(frozen=True)
class ToolCall:
    """One function call made by the assistant. ``arguments`` is the JSON text, kept verbatim."""

    name: str
    arguments: str
    id: str | None = None
    type: str = "function"


@dataclass(frozen=True)
class Message:
    role: Role
    content: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Prompt:
    """One prompt of a dataset. ``tools`` are the JSON schemas of the functions it offers."""

    id: str
    dataset: str
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


#: a conversation of a run: (dataset, prompt id, sample index)
ChainKey = tuple[str, str, int]


@dataclass(frozen=True)
class Key:
    """One unit of work: a (dataset, prompt, sample, turn) answer."""

    dataset: str
    prompt_id: str
    sample_idx: int
    turn: int

    def tuple(self) -> tuple[str, str, int, int]:
        return (self.dataset, self.prompt_id, self.sample_idx, self.turn)

    @property
    def chain(self) -> ChainKey:
        """The conversation this answer belongs to: (dataset, prompt, sample)."""
        return (self.dataset, self.prompt_id, self.sample_idx)

    @property
    def sample_id(self) -> str:
        """The id of the sample made from this answer, in every export."""
        return f"{self.dataset}/{self.prompt_id}/{self.sample_idx}/{self.turn}"


@dataclass(frozen=True)
class Provenance:
    tokenizer_sha256: str
    format_name: str
    format_version: str
    draftdata_version: str


@dataclass(frozen=True)
class LogprobToken:
    """One generated token as a server reports it in ``logprobs``: its text, maybe its raw
    bytes (OpenAI ``bytes``), maybe its id (vLLM ``token_id:N`` with return_tokens_as_token_ids)."""

    token: str
    bytes: tuple[int, ...] | None = None
    id: int | None = None


@dataclass(frozen=True)
class ApiView:
    """What an OpenAI-compatible API returned for one choice, normalised across providers."""

    content: str | None
    finish_reason: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[LogprobToken, ...] | None = None
    #: which provider field the reasoning came from (reasoning, reasoning_content, ...)
    reasoning_field: str | None = None
    #: which server parsed the answer (``tokens.servers``): configured, or told from a raw
    #: response's fields; None: unknown
    server: str | None = None
    #: the server's own token counts for this answer (its ``usage``), the witness the tokens
    #: stage holds the sample's ids against (``tokens.counts``); None: it sent none
    usage: Usage | None = None


@dataclass(frozen=True)
class Usage:
    """What a server says an answer cost, where each value is a finite, non-negative count
    (or cost in USD) within what the ledger stores; None where it said nothing usable."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    #: ``completion_tokens_details.reasoning_tokens``: the part of the completion it counts as
    #: reasoning
    reasoning_tokens: int | None = None


@dataclass(frozen=True)
class ServerProfile:
    """What a server's reasoning and tool parsers do to a model's raw output before we see it,
    as data: named behaviours (``records.servers`` names them and holds one profile per server),
    some done to every model family's answers, some to one family's only. The response grammar
    (``tokens.response``) reads them; each chat format declares what a behaviour loses of its own
    grammar (``ChatFormat.server_losses``)."""

    name: str
    #: what its parsers do to every family's answers
    does: frozenset[str] = frozenset()
    #: what they do to one family's answers only: family (``ChatFormat.family``) -> behaviours
    does_for: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: request fields that keep the view lossless, asked for by generation
    lossless_request: dict[str, Any] = field(default_factory=dict)
    #: how its ``usage`` counts an answer's tokens (the count witness, ``tokens.counts``)
    counting: Counting = field(default_factory=Counting)

    def behaviours(self, family: str | None) -> frozenset[str]:
        """What the server does to the answers of a format of ``family`` (None: of no family)."""
        own = self.does_for.get(family) if family is not None else None
        return self.does | own if own else self.does


@dataclass(frozen=True)
class Completion:
    """One successful answer from a backend, with everything the ledger stores verbatim:
    the request body and the response as the provider sent them (``request``/``response`` are
    the wire payloads; ``request`` as the exact JSON text sent where the backend serialized it),
    and what was parsed out of them."""

    request: dict[str, Any] | str | None
    response: dict[str, Any]
    response_text: str
    finish_reason: str
    view: ApiView
    #: the model's exact answer ids, where the backend returns them
    output_ids: tuple[int, ...] | None = None
    #: the prompt ids the server itself fed the model, where it reports them
    prompt_ids: tuple[int, ...] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float = 0.0
    http_status: int | None = None
    started_at: float = 0.0
    latency_s: float = 0.0
    #: why a paid-for answer cannot be used (stored, then quarantined by the tokens stage)
    problem: str | None = None
    #: ``response`` is ``response_text`` parsed as it is (the ledger then keeps the text only)
    response_is_body: bool = False
    #: why the server's ``usage`` was not taken as it is: ``invalid:<fields>`` (not finite,
    #: negative, out of range), ``under`` (fewer tokens than our own count); None: it agreed
    usage_note: str | None = None
    #: the answer's tokens by draftdata's own count (what it was charged for at least)
    counted_tokens: int | None = None
    #: the ledger row written before the request was sent (``Ledger.answers.begin``)
    intent: int | None = None


@dataclass(frozen=True)
class FailedAttempt:
    """One attempt that did not give an answer (stored verbatim as well)."""

    reason: str
    http_status: int | None
    request: dict[str, Any] | str | None
    response_text: str | None
    started_at: float
    latency_s: float
    final: bool
    #: how long the client waits before the next attempt, and what the server asked for
    wait_s: float = 0.0
    asked_s: float | None = None
    #: the ledger row written before the request was sent (``Ledger.answers.begin``)
    intent: int | None = None
    #: the server's own words for a refusal (its error message), one line; "" where none
    detail: str = ""
    #: what the attempt may have cost (USD): None where it cost nothing (never sent, or
    #: refused by the server); else at least what draftdata counted of it (its prompt, and the
    #: answer's tokens streamed before the client stopped waiting)
    paid_usd: float | None = None
    #: the server's own answer says what it cost (``paid_usd`` as it is); False: no answer
    #: does (a timeout, a cut connection, a body that cannot be read), so it is charged at
    #: least what was reserved for it, the most it may have cost
    settled: bool = False

    @property
    def why(self) -> str:
        """The reason with the server's words: what ``status --failed`` and the closing line
        show (``http_400`` alone says nothing of a prompt past the context)."""
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


@dataclass(frozen=True)
class StoredResponse:
    """The one canonical answer the ledger keeps for a key."""

    key: Key
    backend: str
    response: dict[str, Any]
    output_ids: tuple[int, ...] | None
    #: the prompt ids the server reported (None: it reported none)
    server_prompt_ids: tuple[int, ...] | None
    finish_reason: str
    cost_usd: float
    #: our rendering of the prompt when it was asked
    our_prompt_ids: tuple[int, ...] | None = None
    #: why the answer cannot be used (quarantined), None when it can
    problem: str | None = None


@dataclass(frozen=True)
class Answered:
    """One stored answer with the conversation it answered (its on-policy history rebuilt) and
    the view read from it: what the tokens stage makes a sample of."""

    key: Key
    prompt: Prompt
    messages: tuple[Message, ...]
    stored: StoredResponse
    view: ApiView


@dataclass(frozen=True)
class SampleRow:
    """The tokens stage's outcome for an answer that became a sample: its token source and its
    columns packed for the ledger (``store.codec.sample_row``: compressed in the worker)."""

    key: Key
    token_source: str
    row: tuple[Any, ...]


@dataclass(frozen=True)
class Drop:
    """The tokens stage's outcome for an answer that could not become a sample: why."""

    key: Key
    reason: str


@dataclass(frozen=True)
class PendingChain:
    """A conversation (prompt, sample) with a turn still to ask, how many of its turns are
    answered, and its first turn's prompt ids as rendered when the prompt was stored (None:
    not rendered then, a prompt stored by an older draftdata or one that did not render)."""

    prompt: Prompt
    sample: int
    answered: int
    first_ids: Sequence[int] | None = None  # an array('i'): ``generate.chains.Chain``


@dataclass(frozen=True)
class ChainPage:
    """One page of a run's pending conversations, and the position to read the next from
    (None past the last prompt)."""

    chains: tuple[PendingChain, ...]
    next_after: int | None


@dataclass(frozen=True)
class AnsweredChain:
    """An answered conversation: its prompt, sample and stored answers in turn order."""

    prompt: Prompt
    sample: int
    responses: tuple[StoredResponse, ...]


@dataclass(frozen=True)
class Sample:
    """Token ids a trainer consumes: ``input_ids`` = prompt ids + response ids, ``loss_mask``
    True exactly on the trained ids (the response, including the end-of-turn marker when the
    answer ended). ``provenance`` names what made it; it travels with the sample to every
    export."""

    id: str
    input_ids: list[int]
    loss_mask: list[bool]
    prompt_len: int
    token_source: TokenSource
    finish_reason: str
    provenance: Provenance
    dataset: str = ""
    warnings: tuple[str, ...] = ()
    #: the answer it was made from, for samples made in a run
    key: Key | None = None

    @property
    def response_ids(self) -> list[int]:
        return self.input_ids[self.prompt_len :]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError("input_ids and loss_mask differ in length")


@dataclass(frozen=True)
class PackedSample:
    """A ``Sample`` whose ids and mask are arrays (int32, bool), what reconstruction gives for a
    Parquet file (``reconstruct_many(packed=True)``): its columns are built from them with no
    Python object per token. The same fields as ``Sample``; ``sample()`` is that Sample."""

    id: str
    input_ids: npt.NDArray[np.int32]
    loss_mask: npt.NDArray[np.bool_]
    prompt_len: int
    token_source: TokenSource
    finish_reason: str
    provenance: Provenance
    dataset: str = ""
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError("input_ids and loss_mask differ in length")

    def sample(self) -> Sample:
        return Sample(
            id=self.id,
            input_ids=self.input_ids.tolist(),
            loss_mask=self.loss_mask.tolist(),
            prompt_len=self.prompt_len,
            token_source=self.token_source,
            finish_reason=self.finish_reason,
            provenance=self.provenance,
            dataset=self.dataset,
            warnings=self.warnings,
        )


@dataclass(frozen=True)
class Decoding:
    """How an answer was decoded, as far as it is known: ``temperature`` 0 is greedy (arg-max),
    above 0 a draw from softmax(logits / T) cut to the top-p nucleus; ``None`` is unknown."""

    temperature: float | None = None
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def label(self) -> str:
        if self.temperature is None:
            return "unknown"
        return "greedy" if self.greedy else "sampled"


FlagKind = Literal["trained", "marker", "after_prompt_control"]


@dataclass(frozen=True)
class Flag:
    """A token the target model found implausible: its position in the sample and log p."""

    position: int
    token: int
    logprob: float
    kind: FlagKind


@dataclass(frozen=True)
class Repair:
    """One change the model stage made to an answer: at ``position`` (in the answer) ``old``
    became ``new``, with both log-probabilities."""

    position: int
    old: int
    new: int
    old_logprob: float
    new_logprob: float


@dataclass(frozen=True)
class SampleScore:
    """One sample's figures: log p of its trained tokens and the flags raised."""

    sample_id: str
    dataset: str
    token_source: str
    trained: int
    sum_logprob: float
    min_logprob: float
    flags: tuple[Flag, ...] = ()
    repairs: int = 0


@dataclass(frozen=True)
class StoredScore:
    """A sample's score as the ledger keeps it: which model and threshold made it, and the
    repairs it made."""

    key: Key
    model: str
    threshold: float
    score: SampleScore
    repairs: tuple[Repair, ...] = ()


@dataclass(frozen=True)
class GroundTruth:
    """A real generation with the exact ids the engine fed and produced, and (where known) the
    text a server returned for it. The evidence validation measures reconstruction against."""

    id: str
    messages: tuple[Message, ...]
    prompt_ids: tuple[int, ...] | None
    output_ids: tuple[int, ...]
    finish_reason: str
    tools: tuple[dict[str, Any], ...] = ()
    #: records of one prompt share a group, so held-out splits never leak a prompt
    group: str = ""
    source: str = "all"
    view: ApiView | None = None
    decoding: Decoding = Decoding()


@dataclass(frozen=True)
class Mismatch:
    """Where a reconstruction first differs from the truth, shown as tokens around it."""

    id: str
    where: Literal["prompt", "response"]
    position: int
    truth: str
    ours: str
    text: str


@dataclass(frozen=True)
class ValidationResult:
    """One ground-truth record measured: exact or not, how close, and why not."""

    id: str
    source: str
    exact: bool
    prompt_exact: bool
    token_matches: int
    token_total: int
    category: str | None
    first_divergence: int | None  # index into the response ids (or the prompt, for prompt_*)
    token_source: str
    example: Mismatch | None = None
    #: the ``lossy:*`` labels the sample carried (its server lost text, and the ids there are
    #: the format's guess); ``exact`` still says whether the ids equal the truth (the guess held)
    lossy: tuple[str, ...] = ()
