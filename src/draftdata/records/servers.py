"""What parses an answer before we see it: the server profiles.

A server's reasoning parser and tool parser cut the model's raw output into
``reasoning_content`` / ``content`` / ``tool_calls``. Each server does it its own way, and some
of what they do cannot be undone (stripped whitespace, re-serialised arguments). A profile
names what its server does, so reconstruction either undoes it exactly or labels the sample
``lossy:<reason>``: a lossy sample may still be right, but nothing proves it, and validation
never counts it exact.

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

from . import ServerProfile

__all__ = ["PROFILES", "SERVERS", "ServerProfile", "check_server", "profile"]


PROFILES: dict[str, ServerProfile] = {
    "auto": ServerProfile(
        "auto",
        think_verbatim=None,
        strips_tool_content=False,
        redumps_json_arguments=False,
        strips_kimi_tool_whitespace=False,
        renumbers_kimi_ids=False,
    ),
    "vllm": ServerProfile(
        "vllm",
        think_verbatim=True,
        # run, not read (benchmarks/vllm_oracle.py on vLLM 0.34.0): its parser engine strips
        # the content next to tool calls, and content that is only whitespace becomes null
        strips_tool_content=True,
        redumps_json_arguments=True,
        strips_kimi_tool_whitespace=True,
        renumbers_kimi_ids=False,
        strips_kimi_reasoning_whitespace=True,
        drops_cut_tool_sections=True,
        lossless_request={"skip_special_tokens": False, "spaces_between_special_tokens": False},
    ),
    "sglang": ServerProfile(
        "sglang",
        think_verbatim=True,
        strips_tool_content=True,
        redumps_json_arguments=True,
        strips_kimi_tool_whitespace=True,
        renumbers_kimi_ids=True,
        # run, not read (benchmarks/sglang_oracle.py on SGLang 0.5.23): _process_tool_calls
        # drops a tool section it cannot parse, one cut by max_tokens included
        drops_cut_tool_sections=True,
        lossless_request={"skip_special_tokens": False},
    ),
    "openrouter": ServerProfile(
        "openrouter",
        think_verbatim=None,
        strips_tool_content=True,
        redumps_json_arguments=True,
        strips_kimi_tool_whitespace=True,
        renumbers_kimi_ids=True,
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
