"""The serving contract, checked before the first paid request: what the server serves (its
engine and context, ``GET /v1/models``) and how it renders a prompt (vLLM's ``/tokenize`` with
the messages), against what draftdata will send and record.

- A dataset whose backend is vLLM or SGLang (configured, or named by ``/v1/models`` where
  ``server = "auto"``) and asks for ids returns the engine's own ids: it needs no gate, and its
  answers are the gate's evidence for the text datasets of the same target.
- A prompt whose ids plus ``max_tokens`` pass the server's ``max_model_len`` cannot be answered
  whole: it is counted by ``plan`` and skipped as ``over_context`` by the run, never sent.
- Our prompt ids must equal the server's own rendering, on a sample of prompts chosen to hold a
  system message, tools and several turns. A prompt with control-token text in it is not
  compared: the server's renderer turns that text into control ids, draftdata never does."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import DatasetCfg, Manifest, OpenAIBackendCfg, redact_url
from ..errors import DraftdataError
from ..formats import BoundFormat
from ..records import Prompt
from ..records.wire import messages_to_wire
from ..tokens.history import n_turns, stand_in_answers, turn_messages
from ..tokens.sample_maker import TokensStage
from ..tokens.target import Target
from .backends.serving import ENGINES, Served, auth_headers, served, tokenize_chat

#: prompts compared with the server's rendering, per dataset
CONTRACT_SAMPLE = 8
OVER_CONTEXT = "over_context"


class ServingContractError(DraftdataError):
    """The server renders prompts differently from draftdata: every id would be wrong."""

    exit_code = 2


class Serving:
    """What each OpenAI-compatible backend's server says of the model it is asked for, asked
    once per backend (``GET /v1/models``, free): its engine and its context."""

    def __init__(self, m: Manifest) -> None:
        self.m = m
        self._got: dict[str, Served | None] = {}

    def served(self, backend: str) -> Served | None:
        """None for a backend that is not an OpenAI-compatible server, or a server that says
        nothing usable (OpenRouter's list names no engine; the replay server no context)."""
        cfg = self.m.backends[backend]
        if not isinstance(cfg, OpenAIBackendCfg):
            return None
        if backend not in self._got:
            model = self.m.target.model if cfg.model is None else cfg.model
            self._got[backend] = served(cfg.base_url, auth_headers(cfg), model)
        return self._got[backend]

    def engine(self, d: DatasetCfg) -> str | None:
        """The engine ("vllm", "sglang") that will return the dataset's answers with its own
        ids, or None: a local engine (its ids are ground truth by construction), a server asked
        for text (``token_ids = "never"``), or a server that is no such engine."""
        cfg = self.m.backends[d.backend]
        if not isinstance(cfg, OpenAIBackendCfg) or cfg.token_ids == "never":
            return None
        if cfg.server in ENGINES:
            return cfg.server
        if cfg.server != "auto":
            return None
        got = self.served(d.backend)
        return got.server if got is not None else None

    def renders(self, d: DatasetCfg) -> bool:
        """Whether the dataset's server renders a conversation into ids for us to compare:
        vLLM's ``/tokenize`` (SGLang has no chat equivalent)."""
        got = self.served(d.backend)
        return got is not None and got.server == "vllm"

    def context(self, d: DatasetCfg) -> int | None:
        """The server's ``max_model_len`` (prompt and answer together), where it says one."""
        got = self.served(d.backend)
        return got.max_model_len if got is not None else None

    def check_rendering(
        self, d: DatasetCfg, target: Target, samples: Sequence[tuple[Prompt, int]]
    ) -> RenderCheck:
        """Our prompt ids against vLLM's ``/tokenize`` on ``samples`` (later turns answer the
        dataset's own assistant messages, or empty ones, as ``plan`` renders them)."""
        return _check_rendering(self.m, d, target, samples, self.served(d.backend))


def over_context(context: int | None, prompt_len: int, max_tokens: int) -> str | None:
    """Why a prompt cannot be answered whole within the server's context (its ids plus
    ``max_tokens`` pass ``max_model_len``), or None where it fits or no context is known."""
    if context is None or prompt_len + max_tokens <= context:
        return None
    return (
        f"{OVER_CONTEXT}: {prompt_len} prompt ids + max_tokens {max_tokens} > the server's "
        f"max_model_len {context}"
    )


def contract_sample(
    prompts: Iterable[Prompt], turns: str, k: int = CONTRACT_SAMPLE
) -> list[tuple[Prompt, int]]:
    """Up to ``k`` (prompt, turn) pairs to compare: the first prompt with a system message, the
    first with tools, the last turn of the first with several turns, then the first prompts."""
    chosen: list[tuple[Prompt, int]] = []
    firsts: list[tuple[Prompt, int]] = []
    want = {"system": True, "tools": True, "turns": True}
    for p in prompts:
        n = n_turns(p, turns)
        if want["system"] and any(x.role == "system" for x in p.messages):
            chosen.append((p, 0))
            want["system"] = False
        if want["tools"] and p.tools:
            chosen.append((p, 0))
            want["tools"] = False
        if want["turns"] and n > 1:
            chosen.append((p, n - 1))
            want["turns"] = False
        if len(firsts) < k:
            firsts.append((p, 0))
        if not any(want.values()) and len(firsts) >= k:
            break
    out = list(dict.fromkeys((p.id, t) for p, t in chosen + firsts))[:k]
    by_id = {p.id: p for p, _ in chosen + firsts}
    return [(by_id[i], t) for i, t in out]


@dataclass(frozen=True)
class RenderCheck:
    """Our prompt ids against the server's own rendering."""

    #: prompts compared, and equal
    compared: int
    #: prompts not compared: control-token text in them, or the server could not say
    skipped: int
    #: the first difference, said in one line; None: every compared prompt was equal
    mismatch: str | None = None
    #: why nothing could be compared (the server has no /tokenize), or ""
    unchecked: str = ""


def _differ(bound: BoundFormat, ours: Sequence[int], theirs: Sequence[int]) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )
    tok = bound.tokenizer

    def around(ids: Sequence[int]) -> str:
        part = ids[max(0, at - 3) : at + 4]
        return f"{list(part)} {tok.decode(part)!r}"

    return (
        f"the first difference is at position {at} of {len(ours)} (ours) / {len(theirs)} "
        f"(server): ours {around(ours)}, the server's {around(theirs)}"
    )


def _check_rendering(
    m: Manifest,
    d: DatasetCfg,
    target: Target,
    samples: Sequence[tuple[Prompt, int]],
    got: Served | None,
) -> RenderCheck:
    cfg = m.backends[d.backend]
    if not isinstance(cfg, OpenAIBackendCfg) or got is None:
        return RenderCheck(0, len(samples), unchecked="the server did not describe its model")
    stage, bound = TokensStage(target), target.bound
    controls = tuple(t for t in bound.tokenizer.control_by_text if t)
    kwargs = cfg.extra_body.get("chat_template_kwargs")
    compared = skipped = 0
    for p, t in samples:
        try:
            msgs = turn_messages(p, d.turns, t, stand_in_answers(p, t + 1))
            ours = stage.render_prompt(msgs, p)
        except DraftdataError:
            skipped += 1  # the run quarantines it with the reason
            continue
        if any(c in (x.content or "") for x in msgs for c in controls):
            skipped += 1
            continue
        request: dict[str, Any] = {"model": got.model, "messages": messages_to_wire(msgs)}
        if p.tools:
            request["tools"] = list(p.tools)
        if isinstance(kwargs, dict):
            request["chat_template_kwargs"] = kwargs
        theirs = tokenize_chat(cfg.base_url, auth_headers(cfg), request)
        if isinstance(theirs, str):
            if compared == 0:
                return RenderCheck(
                    0,
                    len(samples),
                    unchecked=f"{redact_url(cfg.base_url)} could not render a prompt: {theirs}",
                )
            skipped += 1
            continue
        if ours != theirs:
            turn = f", turn {t}" if t else ""
            return RenderCheck(
                compared,
                skipped,
                mismatch=f"prompt {p.id}{turn}: {_differ(bound, ours, theirs)}",
            )
        compared += 1
    return RenderCheck(compared, skipped)


def refuse_mismatch(d: DatasetCfg, check: RenderCheck) -> None:
    if check.mismatch is not None:
        raise ServingContractError(
            f"dataset {d.name}: the server renders prompts differently from draftdata, so every "
            f"id would be wrong ({check.mismatch}); serve the model with its own chat template "
            "(no --chat-template), or set [target] format and tokenizer to what it serves; "
            "nothing was sent"
        )


def check_dataset(
    serving: Serving, d: DatasetCfg, target: Target, prompts: Iterable[Prompt]
) -> str | None:
    """The dataset's prompt rendering against its vLLM server's own, on a sample of
    ``prompts``: a difference refuses the dataset (``ServingContractError``), with both
    renderings at the first differing position; returns what was compared, said in one line
    (None: the server is no vLLM, so nothing could be compared)."""
    if not serving.renders(d):
        return None
    samples = contract_sample(prompts, d.turns)
    check = serving.check_rendering(d, target, samples)
    refuse_mismatch(d, check)
    if not check.compared:
        return f"{d.name}: prompt rendering not checked against the server: {check.unchecked}"
    held = f" ({check.skipped} hold control-token text)" if check.skipped else ""
    return (
        f"{d.name}: our prompt ids equal the server's own rendering on {check.compared} of "
        f"{len(samples)} prompts checked{held}"
    )


__all__ = [
    "OVER_CONTEXT",
    "RenderCheck",
    "Serving",
    "ServingContractError",
    "check_dataset",
    "contract_sample",
    "over_context",
    "refuse_mismatch",
]
