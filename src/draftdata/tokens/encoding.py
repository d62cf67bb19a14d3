"""The target's encoding: the part of a :class:`~draftdata.tokens.target.Target` that turns
segments into ids, below reconstruction (which takes it whole: ``tokens.reconstruct``,
``tokens.response``, ``tokens.turns``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..errors import DraftdataError, FormatError
from ..formats import BoundFormat, ChatFormat, Segment
from ..formats.segments import TextIds
from ..records import Message
from ..tokenizers import Tokenizer
from .pieces import PieceEncoder

__all__ = ["TargetEncoding"]

_T = TypeVar("_T", bound="TargetEncoding")

Prompts = Sequence[tuple[Sequence[Message], Sequence[dict[str, Any]]]]


@dataclass(frozen=True)
class TargetEncoding:
    """The bound format, the split preferences (``prefs``: a piece's text and canonical ids ->
    the ids the model writes, the same bytes; None: canonical), the thinking option (None: the
    format's default) and the prompt options (Kimi's ``preserve_thinking``), as one frozen
    value."""

    bound: BoundFormat
    prefs: TextIds | None = None
    thinking: bool | None = None
    prompt_options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.bound.tokenizer

    @property
    def format(self) -> ChatFormat:
        return self.bound.format

    @property
    def canonical(self: _T) -> _T:
        """This target without split preferences: each text piece's canonical ids."""
        return self if self.prefs is None else replace(self, prefs=None)

    def with_prefs(self: _T, prefs: TextIds | None) -> _T:
        """This target with split preferences ``prefs`` (a new value)."""
        return replace(self, prefs=prefs)

    def with_options(self: _T, **options: Any) -> _T:
        """This target with more prompt options (``thinking`` sets the thinking option)."""
        thinking = options.pop("thinking", self.thinking)
        opts = {**self.prompt_options, **options}
        return replace(self, thinking=thinking, prompt_options=opts)

    @property
    def prompt_opts(self) -> dict[str, Any]:
        """What the format's ``render_prompt`` is given: the prompt options and, where set,
        the thinking option."""
        opts = dict(self.prompt_options)
        if self.thinking is not None:
            opts["thinking"] = self.thinking
        return opts

    def encoder(self, arrays: bool = False) -> PieceEncoder:
        """The one encoder from segments to ids, with this target's markers and preferences;
        ``arrays``: it keeps ids as int32 arrays."""
        return PieceEncoder(
            self.tokenizer, self.bound.ids, self.prefs, self.format.name, arrays=arrays
        )

    def encode(
        self, segments: Sequence[Segment], open_end: bool = False
    ) -> tuple[list[int], list[bool]]:
        """``input_ids`` and ``loss_mask`` of one sequence of segments: every control token its
        verified id, every text encoded as text, trained text with the preferences.
        ``open_end``: a last text piece is encoded as the start of a longer text (a truncated
        answer's)."""
        enc = self.encoder()
        layout, trained = enc.layout(segments, open_end)
        enc.run()
        ids, mask = enc.assemble(layout, trained)
        return ids, mask

    def response_ids(self, segments: Sequence[Segment], finish_reason: str) -> list[int]:
        """An answer's segments as trained ids: open-ended where ``length`` cut it."""
        enc = self.encoder()
        layout, _ = enc.layout(segments, finish_reason == "length")
        enc.run()
        ids: list[int] = enc.assemble(layout, True)[0]
        return ids

    def piece_ids(self, text: str, open_end: bool = False) -> list[int]:
        """The ids of one trained text piece (open-ended: the prefix of ``text + probe``, as a
        truncated answer's last piece)."""
        from ..formats import Text

        return self.encode([Text(text, True)], open_end)[0]

    def prompt_ids(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = ()
    ) -> list[int]:
        """The ids of one prompt, rendered by the format with this target's options."""
        (got,) = self.prompt_ids_many([(messages, tools)])
        if isinstance(got, DraftdataError):
            raise got
        return got

    def prompt_ids_many(self, prompts: Prompts) -> list[list[int] | DraftdataError]:
        """The ids of many prompts (messages, tools) in one batched encode: each the same as
        ``prompt_ids``, or the error that stopped that one."""
        enc = self.encoder()
        opts = self.prompt_opts
        layouts: list[list[int | str] | DraftdataError] = []
        for messages, tools in prompts:
            try:
                segs = self.format.render_prompt(messages, tools, **opts)
                layouts.append(enc.layout(segs)[0])
            except DraftdataError as e:
                layouts.append(e)
            except (TypeError, ValueError, AttributeError) as e:  # a malformed prompt record
                layouts.append(FormatError(f"{type(e).__name__}: {e}"))
        enc.run()
        out: list[list[int] | DraftdataError] = []
        for lay in layouts:
            try:
                out.append(lay if isinstance(lay, DraftdataError) else enc.assemble(lay, False)[0])
            except DraftdataError as e:
                out.append(e)
        return out
