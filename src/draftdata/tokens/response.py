"""A server's view of one answer -> the segments the model generated: reasoning found where the
server left it, the think block's whitespace kept or re-written (and labelled where it cannot
be known), the tool-call section, the end of turn. What each server did to the text is its
profile's business (``records.servers``): this module is the one place that reads a server's
behaviours for the answer's family and asks the format which of them lose what of its grammar
(``ChatFormat.server_losses``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import ReconstructError
from ..formats import BoundFormat, ChatFormat, Segment, ThinkGrammar
from ..records import FINISHED, ApiView, Message, ToolCall
from ..records.servers import KEEPS_THINK_VERBATIM, STRIPS_TOOL_CONTENT, profile

if TYPE_CHECKING:
    from .encoding import TargetEncoding


def answer_segments(
    target: TargetEncoding, messages: Sequence[Message], view: ApiView
) -> tuple[list[Segment], list[str]]:
    """``response_segments`` for the answer to ``messages``: under the thinking option the
    format lays that answer out with (``ChatFormat.answer_thinking``). Where the template opens
    no think block before it (DeepSeek V3.1 after tool results) but the request asked for
    thinking, a server whose reasoning parser splits at the close marker (vLLM's and SGLang's
    R1-style parsers) finds none and returns the whole answer as reasoning: it is the answer's
    text, verbatim, and is laid out as such (``reasoning_read_as_answer``)."""
    bound, thinking = target.bound, target.thinking
    shown = bound.format.answer_thinking(messages, thinking)
    warnings: list[str] = []
    if shown is False and thinking is not False and view.reasoning and not view.content:
        text = view.reasoning
        if any(c in text for c in bound.tokenizer.control_by_text):
            raise ReconstructError(
                "the answer after tool results came back as reasoning with control-token text "
                "in it (the server's reasoning parser took the whole answer, tool calls "
                "included); generate it with thinking off",
                "reasoning_holds_markers",
            )
        view = replace(view, content=text, reasoning=None)
        warnings.append("reasoning_read_as_answer")
    segs, warns = response_segments(bound, view, shown=shown)
    return segs, warnings + warns


def server_behaviours(fmt: ChatFormat, view: ApiView) -> frozenset[str]:
    """What the parsers of the server that returned ``view`` do to answers of ``fmt``'s family
    (``records.servers``): the one place a server's behaviour is read."""
    return profile(view.server).behaviours(fmt.family)


def model_tool_calls(
    fmt: ChatFormat, view: ApiView, history: Sequence[Message]
) -> tuple[tuple[ToolCall, ...], int]:
    """The view's tool calls with the ids the model itself wrote, where the server numbered
    them itself (the format's declared ``ids`` loss) or they are not in the model's own form;
    and how many were rebuilt."""
    renumbered = fmt.server_loss("ids", server_behaviours(fmt, view)) is not None
    return fmt.model_ids(view.tool_calls, history, renumbered)


def cut_loss(fmt: ChatFormat, view: ApiView) -> str | None:
    """What the server's tool parser may have dropped of an answer cut by ``max_tokens`` that
    came back with no call (the format's declared ``cut`` loss), or None."""
    return fmt.server_loss("cut", server_behaviours(fmt, view))


def response_segments(
    bound: BoundFormat, view: ApiView, *, shown: bool | None = None
) -> tuple[list[Segment], list[str]]:
    """The segments of the answer as the model generated it, and warnings about what was
    inferred (reasoning found inline, an empty think block rendered, ...). ``shown``: whether
    the answer is laid out with its think block (None: where the format has one)."""
    fmt = bound.format
    th = fmt.think
    does = server_behaviours(fmt, view)
    warnings: list[str] = []
    content = view.content or ""
    reasoning = view.reasoning
    verbatim = False
    thinking = th is not None if shown is None else shown
    if th is not None:
        content, reasoning, verbatim = _think_block(fmt, th, does, view, thinking, warnings)
    elif reasoning:
        raise ReconstructError(
            f"format {fmt.name} has no think markers for this tokenizer, but the response has "
            "reasoning; use a tokenizer with <think> tokens or a format that declares them",
            "reasoning_without_think_grammar",
        )
    _check_tool_calls(fmt, view)
    warnings += _answer_warnings(bound, view, content, reasoning)
    # the content before a tool call: exactly the model's text (a verbatim server), or the
    # grammar's separator added where the text does not already end with it
    stripped = STRIPS_TOOL_CONTENT in does
    as_is = (verbatim or KEEPS_THINK_VERBATIM in does) and not stripped
    if view.tool_calls:
        warnings += _tool_call_warnings(fmt, does, view)
    segs = fmt.render_response(
        content=content,
        reasoning=reasoning,
        tool_calls=view.tool_calls,
        finished=view.finish_reason in FINISHED,
        thinking=bool(thinking) and th is not None,
        verbatim=verbatim,
        content_as_is=verbatim and not (view.tool_calls and stripped),
        tool_text="as_is" if as_is else "add_missing",
    )
    return segs, warnings


def _think_block(
    fmt: ChatFormat,
    th: ThinkGrammar,
    does: frozenset[str],
    view: ApiView,
    thinking: bool,
    warnings: list[str],
) -> tuple[str, str | None, bool]:
    """The content and the reasoning either side of the think block (None: no block), and
    whether they are the server's text verbatim; what was inferred is added to ``warnings``."""
    content, reasoning = _inline_reasoning(fmt, th, view, thinking, warnings)
    if thinking:
        if reasoning is None or reasoning == "":
            warnings.append("empty_reasoning")
        return _think_whitespace(fmt, th, does, view, reasoning or "", content, warnings)
    if reasoning:
        raise ReconstructError(
            "the response has reasoning but the prompt was rendered with thinking off; "
            "rerun with thinking on",
            "reasoning_with_thinking_off",
        )
    if th.prompt_opens and not th.open_suffix and content.startswith(" "):
        # the space a spaced detokenizer joins after the prompt's last marker (Kimi's
        # grammar writes none there; the model may have, so it is labelled)
        warnings.append("lossy:special_token_spaces")
    return content, None, False


def _inline_reasoning(
    fmt: ChatFormat, th: ThinkGrammar, view: ApiView, thinking: bool, warnings: list[str]
) -> tuple[str, str | None]:
    """The content and the reasoning, with reasoning the server left inline in the content
    taken out of it. It is looked for only where the prompt let the model think: with thinking
    off, marker text in an answer is the answer's text."""
    content, reasoning = view.content or "", view.reasoning
    open_t, close_t = fmt.markers[th.open].text, fmt.markers[th.close].text
    if not thinking or reasoning is not None:
        return content, reasoning
    if close_t in content:
        head, _, content = content.partition(close_t)
        stripped = head.lstrip()
        if stripped.startswith(open_t):
            head = stripped[len(open_t) :]
        warnings.append("reasoning_inline_in_content")
        return content, head
    if content.lstrip().startswith(open_t):
        if view.finish_reason in FINISHED:
            raise ReconstructError(
                f"content opens {open_t} but never closes it although the answer finished",
                "unclosed_think",
            )
        warnings.append("reasoning_inline_in_content")
        return "", content.lstrip()[len(open_t) :]
    return content, reasoning


def _think_whitespace(
    fmt: ChatFormat,
    th: ThinkGrammar,
    does: frozenset[str],
    view: ApiView,
    reasoning: str,
    content: str,
    warnings: list[str],
) -> tuple[str, str, bool]:
    """The content and reasoning with the whitespace around the think markers kept (a verbatim
    server) or re-written from the grammar, and whether they are kept verbatim; what may have
    been lost is added to ``warnings``."""
    cut = view.finish_reason == "length" and not content and not view.tool_calls
    verbatim = _think_verbatim(does, th, reasoning, content, cut, bool(view.tool_calls))
    if not verbatim:  # re-written from the grammar: exact only where the model kept to it
        # (no reasoning at all: the empty block the template itself writes, as before;
        # it says ``empty_reasoning``)
        if reasoning and _grammar_newlines(th, cut):
            warnings.append("lossy:think_whitespace")
        if cut and "\n" in th.open_suffix:
            # cut inside the reasoning: newlines at the cut are the model's
            reasoning = reasoning.lstrip("\n")
        elif "\n" in th.open_suffix + th.close_prefix:
            reasoning = reasoning.strip("\n")
        if "\n" in th.close_suffix:
            content = content.lstrip("\n")
    elif view.tool_calls and STRIPS_TOOL_CONTENT in does:
        content = content.lstrip("\n")  # stripped by the server: the grammar's suffix
    if _spaced_markers(th, reasoning, content, cut, bool(view.tool_calls)):
        warnings.append("lossy:special_token_spaces")
    lost = fmt.server_loss("think", does) if reasoning and not cut else None
    if lost and f"lossy:{lost}" not in warnings:
        warnings.append(f"lossy:{lost}")
    return content, reasoning, verbatim


def _check_tool_calls(fmt: ChatFormat, view: ApiView) -> None:
    """Refuses tool calls the format cannot lay out, and a tool-call finish without calls."""
    if view.tool_calls and not fmt.has_tool_grammar:
        raise ReconstructError(
            f"the answer calls tools but format {fmt.name} has no tool-call grammar",
            "tool_calls_without_grammar",
        )
    if view.finish_reason == "tool_calls" and not view.tool_calls:
        # the server's tool parser saw a call it could not return (unreadable, or the content
        # cut where marker-like text began): the section's ids are unknown, so no honest rebuild
        raise ReconstructError(
            "the server says the answer ended in tool calls but returned none (its tool parser "
            "could not read them); the model's ids for that section are unknown",
            "tool_calls_finish_without_calls",
        )


def _answer_warnings(
    bound: BoundFormat, view: ApiView, content: str, reasoning: str | None
) -> list[str]:
    """What the answer's text and its finish say may have been lost or guessed."""
    warnings = []
    if reasoning and not content.strip() and not view.tool_calls and view.finish_reason in FINISHED:
        # a finished answer that is only reasoning: a parser that cut the reasoning at marker
        # text the model typed returns this (vLLM's Qwen3.5), and so does one that nulls
        # whitespace-only content; what followed the reasoning is unknown either way
        warnings.append("lossy:reasoning_without_answer")
    if _holds_control_text(bound, content, reasoning or ""):
        # a control token's text in the answer: the model most likely wrote the token (a
        # parser that failed returns the raw output, markers as text), and text is never
        # encoded as a control id; the model may also have typed it, so it is labelled
        warnings.append("lossy:control_text_in_answer")
    if view.finish_reason not in FINISHED and view.finish_reason != "length":
        warnings.append(f"finish_reason_{view.finish_reason}")
    return warnings


def _tool_call_warnings(fmt: ChatFormat, does: frozenset[str], view: ApiView) -> list[str]:
    """What the server's tool parser may have lost of an answer's tool calls: what any parser
    loses of them, else what the server's behaviours (``does``) lose of the format's grammar."""
    warnings = []
    if STRIPS_TOOL_CONTENT in does:
        warnings.append("lossy:content_stripped")
    if view.finish_reason == "length":
        # a call cut by max_tokens: the server returned what it could parse, and the
        # section is closed by the grammar where the model never wrote its end
        warnings.append("lossy:truncated_tool_call")
    lost = fmt.tool_call_loss(view.tool_calls) or fmt.server_loss("tool_calls", does)
    if lost:
        warnings.append(f"lossy:{lost}")
    return warnings


_CONTROL_TEXT: dict[int, tuple[Any, re.Pattern[str] | None]] = {}


def _holds_control_text(bound: BoundFormat, *texts: str) -> bool:
    """Whether any of ``texts`` holds the text of one of the tokenizer's control tokens (one
    compiled pattern per tokenizer)."""
    tok = bound.tokenizer
    got = _CONTROL_TEXT.get(id(tok))
    if got is None or got[0] is not tok:
        words = sorted((t for t in tok.control_by_text if t.strip()), key=len, reverse=True)
        got = (tok, re.compile("|".join(map(re.escape, words))) if words else None)
        _CONTROL_TEXT[id(tok)] = got
    pattern = got[1]
    return pattern is not None and any(t and pattern.search(t) for t in texts)


def _spaced_markers(th: Any, reasoning: str, content: str, cut: bool, tools: bool) -> bool:
    """Whether the text around the close marker shows a detokenizer that joined it with
    spaces (vLLM's ``spaces_between_special_tokens``, on by default, and the same option of
    HF's slow tokenizers: every added token becomes a piece of its own and the pieces are
    joined with one space). Told only where the grammar writes no whitespace on either side of
    the marker (Kimi): reasoning that ends in a space before it and an answer that starts with
    one after it. The model may have written both, so it is labelled, not undone."""
    if th.prompt_opens and not th.open_suffix and reasoning.startswith(" "):
        return True  # the space joined after the prompt's own open marker
    if th.close_prefix or th.close_suffix or cut or not reasoning.endswith(" "):
        return False
    return content.startswith(" ") or (not content and tools)


def _grammar_newlines(th: Any, cut: bool) -> bool:
    """Whether the think grammar writes newlines around the markers (what a server may drop)."""
    pieces = [] if th.prompt_opens else [th.open_suffix]
    if not cut:
        pieces += [th.close_prefix, th.close_suffix]
    return any("\n" in p for p in pieces)


def _think_verbatim(
    does: frozenset[str], th: Any, reasoning: str, content: str, cut: bool, tools: bool
) -> bool:
    """Whether reasoning and content are exactly the text around the think markers: the
    server's profile says so, or (unknown server) every newline the grammar puts there is there."""
    if KEEPS_THINK_VERBATIM in does:
        return True
    checks = []
    if th.open_suffix and not th.prompt_opens:
        checks.append(reasoning.startswith(th.open_suffix))
    if th.close_prefix and not cut:
        checks.append(reasoning.endswith(th.close_prefix))
    if th.close_suffix and (content or tools):
        checks.append(content.startswith(th.close_suffix))
    return all(checks)
