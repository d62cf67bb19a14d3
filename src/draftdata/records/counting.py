"""How a server counts an answer's tokens in its ``usage``: the count witness's conventions, as
data (``tokens.counts``; one per server profile, ``records.servers``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counting:
    """How a server counts an answer's tokens in its ``usage``, as data (one per server
    profile; a run checks it on the answers that came with the server's own ids, and uses
    what those show, ``tokens.counts.fit``)."""

    #: ``completion_tokens`` counts the stop id of an answer that ended (vLLM, SGLang: the
    #: engine's output ids hold it); None: not known, either is taken
    end_marker: bool | None = True
    #: a think opener the template writes at the end of the prompt (a prefilled ``<think>``)
    #: is counted as completion, not prompt (OpenRouter's Kimi K2.5 provider)
    think_opener_in_completion: bool = False
    #: tokens the server counts in the prompt beyond the template's ids (a BOS it adds: 1);
    #: None: not known, the prompt count is not checked
    prompt_extra: int | None = 0
    #: what ``reasoning_tokens`` counts of the think span: ``inner`` (the ids between the
    #: markers), ``with_close`` (and the close marker), ``with_markers`` (and both); None:
    #: not known, not checked
    reasoning: str | None = None

    def describe(self) -> str:
        """The convention in words, for the lines that say which one a run used."""
        parts = [
            "end marker counted or not"
            if self.end_marker is None
            else "end marker counted"
            if self.end_marker
            else "end marker not counted",
            "think opener counted as completion" if self.think_opener_in_completion else "",
            "prompt not checked"
            if self.prompt_extra is None
            else f"{self.prompt_extra:+d} prompt token(s)"
            if self.prompt_extra
            else "",
            f"reasoning counted {self.reasoning}" if self.reasoning else "",
        ]
        return ", ".join(p for p in parts if p)


def warning_kind(warning: str) -> str:
    """What a sample's warning is counted under (``status``, ``validate``): its text before
    the figures of that one sample, which a detail gives in parentheses
    (``count_mismatch:completion-1@think_close (ids 311, server 312)`` is counted as
    ``count_mismatch:completion-1@think_close``)."""
    return warning.split(" (", 1)[0]
