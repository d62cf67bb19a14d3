"""API text back to the model's exact token ids.

The prompt is rendered by the format; the response is laid out by the format's response grammar
(think markers and their whitespace, content, native tool-call section, end of turn) with every
control token injected as a verified id and every piece of text encoded as text. Where a response
carries logprobs with token bytes or ids, those give the ids directly (``token_source="logprobs"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__
from ..errors import ReconstructError
from ..formats import BoundFormat, Segment, Text, merge_text
from ..records import FINISHED, ApiView, Message, Provenance, Sample, TokenSource
from .logprobs import ids_from_logprobs

TextIds = Callable[[str, list[int]], list[int]]


def provenance(bound: BoundFormat) -> Provenance:
    return Provenance(bound.tokenizer.sha256, bound.format.name, bound.format.version, __version__)


def response_segments(
    bound: BoundFormat, view: ApiView, *, thinking: bool | None = None
) -> tuple[list[Segment], list[str]]:
    """The segments of the answer as the model generated it, and warnings about what was
    inferred (reasoning found inline, an empty think block rendered, ...)."""
    fmt = bound.format
    th = fmt.think
    warnings: list[str] = []
    content = view.content or ""
    reasoning = view.reasoning
    if thinking is None:
        thinking = th is not None
    if th is not None:
        open_t, close_t = fmt.markers[th.open].text, fmt.markers[th.close].text
        if reasoning is None and close_t in content:
            head, _, content = content.partition(close_t)
            stripped = head.lstrip()
            if stripped.startswith(open_t):
                head = stripped[len(open_t) :]
            reasoning = head
            warnings.append("reasoning_inline_in_content")
        elif reasoning is None and content.lstrip().startswith(open_t):
            if view.finish_reason in FINISHED:
                raise ReconstructError(
                    f"content opens {open_t} but never closes it although the answer finished",
                    "unclosed_think",
                )
            reasoning, content = content.lstrip()[len(open_t) :], ""
            warnings.append("reasoning_inline_in_content")
        if thinking:
            if reasoning is None or reasoning == "":
                warnings.append("empty_reasoning")
            reasoning = reasoning or ""
        elif reasoning:
            raise ReconstructError(
                "the response has reasoning but the prompt was rendered with thinking off; "
                "rerun with thinking on",
                "reasoning_with_thinking_off",
            )
        else:
            reasoning = None
        if reasoning is not None:
            # a server's reasoning parser may strip or keep the newlines the grammar puts around
            # the markers; the grammar (and the model's own template) writes them exactly
            cut = view.finish_reason == "length" and not content and not view.tool_calls
            if cut and "\n" in th.open_suffix:
                # cut inside the reasoning: newlines at the cut are the model's, not the grammar's
                reasoning = reasoning.lstrip("\n")
            elif "\n" in th.open_suffix + th.close_prefix:
                reasoning = reasoning.strip("\n")
            if "\n" in th.close_suffix:
                content = content.lstrip("\n")
    elif reasoning:
        raise ReconstructError(
            f"format {fmt.name} has no think markers for this tokenizer, but the response has "
            "reasoning; use a tokenizer with <think> tokens or a format that declares them",
            "reasoning_without_think_grammar",
        )
    if view.tool_calls and not fmt.has_tool_grammar:
        raise ReconstructError(
            f"the answer calls tools but format {fmt.name} has no tool-call grammar",
            "tool_calls_without_grammar",
        )
    if view.finish_reason not in FINISHED and view.finish_reason != "length":
        warnings.append(f"finish_reason_{view.finish_reason}")
    segs = fmt.render_response(
        content=content,
        reasoning=reasoning,
        tool_calls=view.tool_calls,
        finished=view.finish_reason in FINISHED,
        thinking=bool(thinking) and th is not None,
    )
    return segs, warnings


#: what a truncated answer's text is assumed to continue with: a ``length`` cut ends mid-stream, and
#: the canonical encoder must not treat the cut as the end of the text (a whitespace run at the end
#: of a string merges differently than one followed by more text)
OPEN_END_PROBE = "a"


def open_ended_ids(tok: Any, text: str, probe: str = OPEN_END_PROBE) -> list[int]:
    """Encode ``text`` as the prefix of ``text + probe``: the ids whose bytes end exactly where
    the text ends. Falls back to the plain encoding when the probe merges into the last token."""
    ids = tok.encode(text + probe)
    extra = len(probe.encode())  # walk back from the end over the probe's bytes only
    k = len(ids)
    while extra > 0 and k > 0:
        k -= 1
        extra -= len(tok.token_bytes(ids[k]))
    if extra == 0:
        return list(ids[:k])
    return list(tok.encode(text))


def encode_response(
    bound: BoundFormat,
    segs: Sequence[Segment],
    finish_reason: str,
    text_ids: TextIds | None = None,
) -> list[int]:
    """Response segments -> ids. A truncated answer's final text is encoded open-ended; learned
    split preferences (``text_ids``) then rewrite each text piece."""
    merged = merge_text(segs)
    last = len(merged) - 1 if merged and isinstance(merged[-1], Text) else -1
    truncated = finish_reason == "length" and last >= 0
    n_text = sum(isinstance(s, Text) for s in merged)
    seen = 0

    def hook(text: str, ids: list[int]) -> list[int]:
        nonlocal seen
        seen += 1
        if truncated and seen == n_text:
            ids = open_ended_ids(bound.tokenizer, text)
        return text_ids(text, ids) if text_ids is not None else ids

    return bound.encode(merged, hook)[0]


def reconstruct(
    bound: BoundFormat,
    messages: Sequence[Message],
    view: ApiView,
    *,
    tools: Sequence[dict[str, Any]] = (),
    record_id: str = "",
    dataset: str = "",
    thinking: bool | None = None,
    text_ids: TextIds | None = None,
    use_logprobs: bool = True,
    prompt_opts: dict[str, Any] | None = None,
    prompt_ids: list[int] | None = None,
) -> Sample:
    """Prompt + API answer -> Sample. ``text_ids`` applies learned split preferences to the
    canonical ids of each response text piece; ``prompt_ids`` skips rendering the prompt again
    (they must be this format's rendering of ``messages``)."""
    opts = dict(prompt_opts or {})
    if thinking is not None and bound.format.think is not None:
        opts["thinking"] = thinking
    if prompt_ids is None:  # callers that rendered the prompt already pass its ids
        prompt_ids, _ = bound.encode(bound.format.render_prompt(messages, tools, **opts))
    warnings: list[str] = []
    source: TokenSource = "reconstructed"
    response: list[int] | None = None
    if use_logprobs and view.logprobs:
        response, reason = ids_from_logprobs(bound, view)
        if response is None:
            warnings.append(f"logprob_fallback:{reason}")
        else:
            source = "logprobs"
    if response is None:
        segs, warns = response_segments(bound, view, thinking=thinking)
        warnings += warns
        response = encode_response(bound, segs, view.finish_reason, text_ids)
    return Sample(
        id=record_id,
        dataset=dataset,
        input_ids=prompt_ids + response,
        loss_mask=[False] * len(prompt_ids) + [True] * len(response),
        prompt_len=len(prompt_ids),
        token_source=source,
        finish_reason=view.finish_reason,
        provenance=provenance(bound),
        warnings=tuple(warnings),
    )
