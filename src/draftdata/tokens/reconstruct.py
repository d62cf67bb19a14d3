"""API text back to the model's exact token ids.

The prompt is rendered by the format; the response is laid out by the format's response grammar
(think markers and their whitespace, content, native tool-call section, end of turn) with every
control token injected as a verified id and every piece of text encoded as text. Where a response
carries logprobs with token bytes or ids, those give the ids directly (``token_source="logprobs"``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING, Any

from ..errors import DraftdataError, ReconstructError
from ..formats import BoundFormat
from ..records import (
    ApiView,
    Counting,
    Message,
    PackedSample,
    Provenance,
    Sample,
    TokenSource,
)
from ..version import __version__
from .counts import witness
from .logprobs import ids_from_logprobs
from .pieces import Layout, PieceEncoder
from .response import answer_segments, cut_loss, model_tool_calls

if TYPE_CHECKING:
    from .encoding import TargetEncoding


def check_ids(bound: BoundFormat, ids: Sequence[Any], what: str) -> list[int]:
    """``ids`` as a list of ints inside the vocabulary, or a ReconstructError naming the first
    that is not (counted as ``id_out_of_vocabulary``)."""
    n = bound.tokenizer.vocab_size
    if ids and set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < n:
        return list(ids)  # the common case, checked at C speed
    out: list[int] = []
    for i, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < n:
            raise ReconstructError(
                f"{what}[{i}] = {x!r} is not an id of this tokenizer (vocabulary {n}); the "
                "server's tokenizer is not the target's, or it sent damaged ids",
                "id_out_of_vocabulary",
            )
        out.append(x)
    return out


def provenance(bound: BoundFormat) -> Provenance:
    return Provenance(bound.tokenizer.sha256, bound.format.name, bound.format.version, __version__)


@dataclass(frozen=True)
class Item:
    """One answer to reconstruct: the conversation it answers and the server's view of it.
    ``prompt_ids`` skips rendering the prompt (they must be this format's rendering)."""

    messages: Sequence[Message]
    view: ApiView
    tools: Sequence[dict[str, Any]] = ()
    record_id: str = ""
    dataset: str = ""
    prompt_ids: Sequence[int] | None = None
    #: train every assistant turn of ``messages`` too, in one sequence (``tokens.turns``)
    all_turns: bool = False
    #: the model's exact answer ids where the server returned them (vLLM ``token_ids``): used
    #: as they are (token source ``engine``), the text is not encoded
    output_ids: Sequence[int] | None = None
    #: the prompt ids the server fed the model (``prompt_token_ids``): kept where they differ
    #: from our rendering, with a ``prompt_drift`` warning
    server_prompt_ids: Sequence[int] | None = None
    #: how the server counts its ``usage`` where the run checked it on the server's own ids
    #: (``tokens.counts.fit``); None: as its profile declares
    counting: Counting | None = None


#: records encoded per batched call: large enough that the tokenizer's batch pays, small enough
#: that a window's segments and ids stay a few MB
WINDOW = 512


def samples(
    target: TargetEncoding,
    items: Iterable[Item],
    *,
    use_logprobs: bool = True,
    window: int = WINDOW,
    packed: bool = False,
) -> Iterator[Sample | PackedSample | DraftdataError]:
    """``Target.reconstruct_many``: each item a Sample (a PackedSample with ``packed``), or the
    error that made that one answer unusable (a ReconstructError carries the drop reason). Text
    is encoded in one batched call per ``window`` records; memory holds one window."""
    bound = target.bound
    prov = provenance(bound)
    it = iter(items)
    # Pipelined: while one window is encoded (native code, off the GIL, on a thread), the
    # samples of the window before are assembled and handed out.
    ahead: tuple[list[Item], PieceEncoder, list[_Plan | DraftdataError], Future[None]] | None
    ahead = None
    while True:
        chunk = list(islice(it, window))
        planned = None
        if chunk:
            enc = target.encoder(arrays=packed)
            plans: list[_Plan | DraftdataError] = []
            for item in chunk:
                try:
                    plans.append(_plan(target, item, enc, use_logprobs))
                except DraftdataError as e:
                    plans.append(e)
            planned = (chunk, enc, plans, _encoder().submit(enc.run))
        if ahead is not None:
            done, enc_done, plans_done, encoded = ahead
            encoded.result()
            for item, plan in zip(done, plans_done, strict=True):
                if isinstance(plan, DraftdataError):
                    yield plan
                    continue
                try:
                    yield _witnessed(bound, item, plan.build(item, enc_done, prov))
                except DraftdataError as e:
                    yield e
        if planned is None:
            return
        ahead = planned


def _witnessed(bound: BoundFormat, item: Item, s: Sample | PackedSample) -> Sample | PackedSample:
    """``s`` with the count witness's label where the server's own counts disagree with its
    ids (``tokens.counts``); a joined conversation is not what the server counted."""
    if item.all_turns or item.view.usage is None:
        return s
    ids = s.input_ids if isinstance(s, Sample) else s.input_ids.tolist()
    labels: tuple[str, ...] = witness(bound, ids, s.prompt_len, item.view, item.counting)
    return replace(s, warnings=(*s.warnings, *labels)) if labels else s


_ENCODER: ThreadPoolExecutor | None = None


def _encoder() -> ThreadPoolExecutor:
    """One thread per process that runs a window's batched encode beside the Python work."""
    global _ENCODER
    if _ENCODER is None:
        _ENCODER = ThreadPoolExecutor(1, thread_name_prefix="draftdata-window")
    return _ENCODER


@dataclass
class _Plan:
    prompt: Layout | None
    response: Layout | None  # None: ``ids`` came from logprobs
    ids: list[int] | None
    source: TokenSource
    warnings: list[str]
    #: the trained flag of each piece, where the whole sequence is one layout (all turns)
    flags: list[bool] | None = None

    def build(self, item: Item, enc: PieceEncoder, prov: Provenance) -> Sample | PackedSample:
        """The sample: lists, or (an encoder that keeps arrays) a PackedSample of arrays."""
        if self.flags is not None and self.response is not None:
            ids, mask = enc.assemble(self.response, self.flags)
            prompt_len = enc.first_trained(mask)
        else:
            prompt = (
                enc.sequence(list(item.prompt_ids))
                if item.prompt_ids is not None
                else enc.assemble(self.prompt or [], False)[0]
            )
            server = item.server_prompt_ids
            if server is not None and list(server) != list(prompt):
                prompt = enc.sequence(list(server))  # what the model saw
                self.warnings.append("prompt_drift")
            if self.response is not None:
                response = enc.assemble(self.response, True)[0]
            else:
                response = enc.sequence(self.ids or [])
            ids, mask = enc.join(prompt, response)
            prompt_len = len(prompt)
        made = PackedSample if enc.arrays else Sample
        return made(
            id=item.record_id,
            dataset=item.dataset,
            input_ids=ids,
            loss_mask=mask,
            prompt_len=prompt_len,
            token_source=self.source,
            finish_reason=item.view.finish_reason,
            provenance=prov,
            warnings=tuple(self.warnings),
        )


def _plan(target: TargetEncoding, item: Item, enc: PieceEncoder, use_logprobs: bool) -> _Plan:
    bound = target.bound
    if item.all_turns:
        from .turns import joined_turns

        segs, warns = joined_turns(target, item.messages, item.view, item.tools)
        layout, flags = enc.layout(segs, item.view.finish_reason == "length")
        warns = [*warns, *_cut_with_tools(bound, item), *_text_lost(item.view)]
        return _Plan(None, layout, None, "reconstructed", list(warns), flags)
    prompt = None
    if item.prompt_ids is None:
        segs = bound.format.render_prompt(item.messages, item.tools, **target.prompt_opts)
        prompt = enc.layout(segs)[0]
    view = item.view
    warnings: list[str] = []
    if item.output_ids is not None and not item.all_turns:
        given = check_ids(bound, item.output_ids, "token_ids")
        if (why := ids_contradict(bound, given, view)) is not None:
            raise ReconstructError(why, "ids_contradict_text")
        engine = bound.closed(given, view.finish_reason)
        return _Plan(prompt, None, engine, "engine", warnings)
    if use_logprobs and view.logprobs:
        ids, reason = ids_from_logprobs(bound, view)
        if ids is not None:
            return _Plan(prompt, None, ids, "logprobs", warnings)
        warnings.append(f"logprob_fallback:{reason}")
    if view.tool_calls:
        calls, rebuilt = model_tool_calls(bound.format, view, item.messages)
        if rebuilt:
            view = replace(view, tool_calls=calls)
            warnings.append("tool_call_ids_rebuilt")
    segs, warns = answer_segments(target, item.messages, view)
    warnings += warns + _cut_with_tools(bound, item) + _text_lost(view)
    response, _ = enc.layout(segs, view.finish_reason == "length")
    return _Plan(prompt, response, None, "reconstructed", warnings)


def ids_contradict(bound: BoundFormat, ids: Sequence[int], view: ApiView) -> str | None:
    """Where an engine's ids cannot be the answer it sent beside them: its content or reasoning
    does not run, in order, through what the ids decode to (the ids of "Hi." beside 960 words,
    or of another text); None where each does. Compared as a subsequence, without what servers
    drop or re-write: whitespace (parsers strip and re-space), control tokens (skipped in
    decoding) and U+FFFD (an incomplete character withheld or replaced); a parser may also cut
    text out of the middle (vLLM deletes a marker's text the model typed, and joins the text
    around a call). Tool calls are not compared (parsers write their arguments again)."""
    said = [t for t in (view.content, view.reasoning) if t and not t.isspace()]
    if not said:
        return None
    control = bound.tokenizer.control_tokens
    decoded = _squeezed(bound.tokenizer.decode([i for i in ids if i not in control]))
    texts = {info.text for info in control.values() if info.text}
    for t in said:
        for c in texts:
            if c in t:
                t = t.replace(c, "")
        rest = iter(decoded)
        if not all(ch in rest for ch in _squeezed(t)):  # a subsequence, in one pass
            return (
                f"the server's token_ids ({len(ids)}) decode to a text that does not hold its "
                f"own answer text ({len(t)} characters); the ids are not that answer's"
            )
    return None


def _squeezed(text: str) -> str:
    return "".join(text.split()).replace("\ufffd", "")


def _text_lost(view: ApiView) -> list[str]:
    """Text the vocabulary cannot hold, or that no longer holds what the model wrote; the
    sample says so, never in silence:

    - ``lossy:lone_surrogate``: a lone surrogate (half a character in JSON's ``\\udXXX``, a
      server that cut an emoji in two) has no UTF-8 bytes, so no token; the encoder writes
      U+FFFD there;
    - ``lossy:replacement_char``: U+FFFD in the text is where a server's decoder met bytes that
      are no valid UTF-8 (a byte piece the model wrote on its own, or an answer cut inside a
      character); which bytes they were is gone, and the ids there are the encoder's U+FFFD
      (SmolLM2's dev ground truth: 6 answers of 531, and none where the model wrote the U+FFFD
      token itself)."""
    texts = [view.content or "", view.reasoning or ""]
    texts += [c.name + c.arguments for c in view.tool_calls]
    lost = ["lossy:lone_surrogate"] if any(_SURROGATE.search(t) for t in texts) else []
    return lost + (["lossy:replacement_char"] if any("\ufffd" in t for t in texts) else [])


_SURROGATE = re.compile("[\ud800-\udfff]")


def _cut_with_tools(bound: BoundFormat, item: Item) -> list[str]:
    """An answer cut by ``max_tokens`` to a request that offered tools, with no call in the
    view: a tool parser may have dropped a section it could not parse (vLLM's DeepSeek parsers
    return the text before it, and R1's ``</think>`` with it), so the end is not known."""
    v = item.view
    if v.finish_reason != "length" or v.tool_calls or not bound.format.has_tool_grammar:
        return []
    lost = "truncated_tool_call" if item.tools else cut_loss(bound.format, v)
    return [f"lossy:{lost}"] if lost else []
