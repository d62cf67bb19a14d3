"""What an answer is charged: draftdata's own count of its tokens at the manifest's prices,
whatever the server's ``usage`` says, and the server's figure only where it is more."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...config import OpenAIBackendCfg
from ...records import ApiView
from ...records.wire import WireAnswer
from ...tokenizers.base import Tokenizer

if TYPE_CHECKING:
    from .base import GenRequest
    from .retry import Sent

#: bytes a token is taken for where an answer is too large to read (English runs 4-5)
BYTES_PER_TOKEN = 4
#: an answer whose tokens (our count, or the server's where that is more) pass RUNAWAY_FACTOR x
#: max_tokens + RUNAWAY_SLACK stops its backend: a re-tokenized answer differs from the model's
#: count by a few percent (SmolLM2's "\n\n" before a list number is one token to the model,
#: two canonically), and a server that honours max_tokens never comes near half as much again
RUNAWAY_FACTOR = 1.5
RUNAWAY_SLACK = 32


#: ``usage.completion_tokens`` below this share of our own count is counted as under-reported
UNDER_REPORT = 0.9


#: a server's ``usage.completion_tokens`` is taken as plausible for an answer of B UTF-8 bytes
#: when it is at least B / this (English is ~4 bytes a token, code ~3, CJK 1.5-3); below it the
#: answer is counted by us. A token covers at least one byte, so the real count is at most B:
#: a server trusted this way can hide no more than this factor of what it wrote.
PLAUSIBLE_BYTES_PER_TOKEN = 8


def answer_tokens(
    tok: Tokenizer, view: ApiView, *, priced: bool, most: float, reported: int | None
) -> int | None:
    """An answer's tokens by our own count (its texts in the target's tokens), or None where
    nothing depends on it, which spares an encode of every answer on the request path. Where
    there is no output price the count cannot change what is charged, and the runaway limit
    (``most`` tokens) is settled without it when the text's UTF-8 bytes are too few to pass it
    (a token covers at least one byte; one more per text for a tokenizer that marks its start),
    or when the server's own count ``reported`` is plausible for those bytes. Not counted,
    ``usage`` is not checked for ``under`` either."""
    texts = [view.reasoning or "", view.content or ""]
    texts += [c.name + c.arguments for c in view.tool_calls]
    if not priced:
        size = sum(len(t.encode("utf-8", "surrogatepass")) + 1 for t in texts)
        if size <= most or (reported is not None and reported * PLAUSIBLE_BYTES_PER_TOKEN >= size):
            return None
    return sum(len(tok.encode(t)) for t in texts if t)


def charge(
    cfg: OpenAIBackendCfg, prompt_n: int, counted: int | None, got: WireAnswer, reserved: float
) -> tuple[float, str | None]:
    """The answer's cost in USD, and the note on its ``usage`` (``invalid:FIELDS``, ``under``,
    ``missing``: no completion count, None where it agrees): ``prompt_n`` prompt tokens (our
    rendering) and ``counted`` answer tokens (the ids, or the text in the target's tokens;
    None: not counted, see ``answer_tokens``); an answer with no usage at all is charged what
    was ``reserved`` for it."""
    usage = got.usage
    pin, pout = cfg.price_in_per_mtok, cfg.price_out_per_mtok
    cost = (prompt_n * pin + (counted or 0) * pout) / 1e6
    ct, pt = usage.completion_tokens, usage.prompt_tokens
    if usage.cost is not None:
        cost = max(cost, usage.cost)
    elif ct is not None:
        cost = max(cost, ((pt if pt is not None else prompt_n) * pin + ct * pout) / 1e6)
    if not got.usage_invalid and ct is None and usage.cost is None:
        cost = max(cost, reserved)  # no usage at all: what was reserved
    note = None
    if got.usage_invalid:
        note = "invalid:" + ",".join(got.usage_invalid)
    elif ct is not None and counted is not None and ct < counted * UNDER_REPORT - 4:
        note = "under"
    elif ct is None:  # no count to hold its ids against: the count witness cannot see it
        note = "missing"
    return cost, note


def attempt_paid(cfg: OpenAIBackendCfg, req: GenRequest, sent: Sent) -> float | None:
    """What an attempt with no usable answer may have cost, at least: None where the server's
    own answer says it failed (an HTTP error) or nothing reached it; else its prompt and the
    answer's tokens counted as they streamed in. A provider bills a generation the client
    stopped waiting for: the runner charges such an attempt what was reserved for it where
    that is more (``Budget.charge_unanswered``)."""
    if sent.unsent or (sent.status is not None and sent.status != 200):
        return None
    written = sent.watch.written() if sent.watch is not None else 0
    return (len(req.prompt_ids) * cfg.price_in_per_mtok + written * cfg.price_out_per_mtok) / 1e6
