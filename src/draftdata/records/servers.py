"""What parses an answer before we see it: the server profiles, as data.

A server's reasoning parser and tool parser cut the model's raw output into
``reasoning_content`` / ``content`` / ``tool_calls``. Each server does it its own way, and some
of what they do cannot be undone (stripped whitespace, re-serialised arguments). A profile
names what its server does, as behaviours (below), some of them only to one model family's
answers; each chat format declares which behaviours lose what of its own grammar
(``ChatFormat.server_losses``, a ``ServerLoss`` each). The response grammar
(``tokens.response``) reads both, so reconstruction either undoes what was done exactly or
labels the sample ``lossy:<label>``: a lossy sample may still be right, but nothing proves it,
and validation never counts it exact. A new server is one row of ``PROFILES``; a family's
susceptibility is its format's declaration.

Read from the servers' own parsers (non-streaming paths):

- vLLM (0.34.0, its own code run by ``benchmarks/vllm_oracle.py``): the reasoning parsers split
  at the think markers and keep both sides verbatim (the newlines the model wrote around
  ``</think>`` included), except Kimi's, which strips the whitespace that ends the reasoning; its
  parser engine strips the content next to tool calls (whitespace-only content becomes null);
  the Hermes-style tool parser re-dumps the arguments with ``json.dumps``; the Kimi K2 tool
  parser matches ``\\s*`` around ids and arguments (whitespace there is lost).
- SGLang: the reasoning detectors keep both sides verbatim; every tool detector strips the
  content before the tool-call section (``.strip()``) and re-dumps JSON arguments; Kimi ids are
  numbered by SGLang's own counter.
- OpenRouter: the provider's parser, unknown; ids of tool calls are often rewritten (``call_``).
- auto: told from the answer itself where its shape shows it (a raw response's fields, the
  newlines around the think markers); what cannot be told is treated as not done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import Counting, ServerProfile

__all__ = [
    "BEHAVIOURS",
    "DROPS_CUT_TOOL_SECTIONS",
    "KEEPS_THINK_VERBATIM",
    "PROFILES",
    "REDUMPS_JSON_ARGUMENTS",
    "RENUMBERS_TOOL_CALL_IDS",
    "SERVERS",
    "STRIPS_REASONING_END_WHITESPACE",
    "STRIPS_TOOL_CALL_WHITESPACE",
    "STRIPS_TOOL_CONTENT",
    "LossPart",
    "ServerLoss",
    "ServerProfile",
    "check_server",
    "profile",
]

# --- the behaviours: what a server's parsers may do to an answer ------------------------------

#: reasoning and content come back exactly as written around the think markers; a server
#: without it has the whitespace there told from the answer's newlines
KEEPS_THINK_VERBATIM = "keeps_think_verbatim"
#: the content before a tool-call section comes back stripped
STRIPS_TOOL_CONTENT = "strips_tool_content"
#: JSON tool-call arguments come back re-serialised (json.dumps of the parsed object)
REDUMPS_JSON_ARGUMENTS = "redumps_json_arguments"
#: whitespace around tool-call ids and arguments is stripped
STRIPS_TOOL_CALL_WHITESPACE = "strips_tool_call_whitespace"
#: tool-call ids are the server's own numbering, not the model's
RENUMBERS_TOOL_CALL_IDS = "renumbers_tool_call_ids"
#: the whitespace that ends the reasoning (before the close marker) is stripped
STRIPS_REASONING_END_WHITESPACE = "strips_reasoning_end_whitespace"
#: a tool-call section cut by max_tokens may be dropped (the text before it comes back)
DROPS_CUT_TOOL_SECTIONS = "drops_cut_tool_sections"

BEHAVIOURS = frozenset(
    {
        KEEPS_THINK_VERBATIM,
        STRIPS_TOOL_CONTENT,
        REDUMPS_JSON_ARGUMENTS,
        STRIPS_TOOL_CALL_WHITESPACE,
        RENUMBERS_TOOL_CALL_IDS,
        STRIPS_REASONING_END_WHITESPACE,
        DROPS_CUT_TOOL_SECTIONS,
    }
)

#: where in an answer a behaviour loses something: ``think`` (the reasoning), ``tool_calls``
#: (the calls' text), ``cut`` (an answer cut by max_tokens that came back with no call), ``ids``
#: (the calls' ids)
LossPart = Literal["think", "tool_calls", "cut", "ids"]


@dataclass(frozen=True)
class ServerLoss:
    """What one behaviour loses of a chat format's grammar for good, as the format declares it:
    a server that does ``behaviour`` to the format's family leaves ``part`` of an answer not
    knowable, and the sample says so with ``lossy:<label>`` (``ids``: the ids are rebuilt from
    the model's own numbering rule, ``ChatFormat.model_ids``, and ``label`` is that warning)."""

    behaviour: str
    part: LossPart
    label: str

    def __post_init__(self) -> None:
        if self.behaviour not in BEHAVIOURS:
            raise ValueError(f"{self.behaviour!r} is not a server behaviour ({sorted(BEHAVIOURS)})")


# --- the servers: what each one's parsers do, for every family and per family ----------------

PROFILES: dict[str, ServerProfile] = {
    # a server not known: whether it counts the end marker, and how it counts the prompt
    "auto": ServerProfile("auto", counting=Counting(end_marker=None, prompt_extra=None)),
    "vllm": ServerProfile(
        "vllm",
        does=frozenset(
            {
                KEEPS_THINK_VERBATIM,
                # run, not read (benchmarks/vllm_oracle.py on vLLM 0.34.0): its parser engine
                # strips the content next to tool calls, and content that is only whitespace
                # becomes null
                STRIPS_TOOL_CONTENT,
                # the Hermes-style tool parser json.loads the call and json.dumps the arguments
                REDUMPS_JSON_ARGUMENTS,
            }
        ),
        does_for={
            # the Kimi K2 tool parser matches ``\s*`` around ids and arguments; the Kimi
            # reasoning parser strips the whitespace that ends the reasoning
            "kimi-k2": frozenset({STRIPS_TOOL_CALL_WHITESPACE, STRIPS_REASONING_END_WHITESPACE}),
            # the DeepSeek V3 / V3.1 tool parsers drop a section cut by max_tokens and return
            # the content before it
            "deepseek-v3": frozenset({DROPS_CUT_TOOL_SECTIONS}),
        },
        lossless_request={"skip_special_tokens": False, "spaces_between_special_tokens": False},
    ),
    "sglang": ServerProfile(
        "sglang",
        does=frozenset(
            {
                KEEPS_THINK_VERBATIM,
                STRIPS_TOOL_CONTENT,
                REDUMPS_JSON_ARGUMENTS,
                # run, not read (benchmarks/sglang_oracle.py on SGLang 0.5.23):
                # _process_tool_calls drops a tool section it cannot parse, one cut by
                # max_tokens included
                DROPS_CUT_TOOL_SECTIONS,
            }
        ),
        # the Kimi K2 detector matches whitespace around ids and arguments, and numbers the
        # ids with SGLang's own counter
        does_for={"kimi-k2": frozenset({STRIPS_TOOL_CALL_WHITESPACE, RENUMBERS_TOOL_CALL_IDS})},
        lossless_request={"skip_special_tokens": False},
    ),
    "openrouter": ServerProfile(
        "openrouter",
        does=frozenset({STRIPS_TOOL_CONTENT, REDUMPS_JSON_ARGUMENTS}),
        # the provider's parser is unknown: taken to do what vLLM's and SGLang's Kimi parsers
        # do, and tool-call ids are often rewritten (``call_``)
        does_for={"kimi-k2": frozenset({STRIPS_TOOL_CALL_WHITESPACE, RENUMBERS_TOOL_CALL_IDS})},
        # a real Kimi K2.5 answer's total agreed with the ids, with the prompt's prefilled
        # <think> counted as completion; the end marker and other providers' prompts not known
        counting=Counting(end_marker=None, think_opener_in_completion=True, prompt_extra=None),
    ),
}

#: every server's name, spelled once: the keys of the table above
SERVERS = tuple(PROFILES)


def check_server(name: str) -> str:
    """``name`` where it is a server profile's; a ValueError naming the choices otherwise."""
    if name not in PROFILES:
        raise ValueError(f"{name!r} is not a server; choose one of {', '.join(SERVERS)}")
    return name


def profile(name: str | None) -> ServerProfile:
    return PROFILES.get(name or "auto", PROFILES["auto"])
