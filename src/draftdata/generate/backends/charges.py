"""What an answer is charged: draftdata's own count of its tokens at the manifest's prices,
whatever the server's ``usage`` says, and the server's figure only where it is more."""

from __future__ import annotations

from ...config import OpenAIBackendCfg
from ...records.wire import WireAnswer

#: ``usage.completion_tokens`` below this share of our own count is counted as under-reported
UNDER_REPORT = 0.9


def charge(
    cfg: OpenAIBackendCfg, prompt_n: int, counted: int, got: WireAnswer, reserved: float
) -> tuple[float, str | None]:
    """The answer's cost in USD, and the note on its ``usage`` (``invalid:FIELDS``, ``under``,
    None where it agrees): ``prompt_n`` prompt tokens (our rendering) and ``counted`` answer
    tokens (the ids, or the text in the target's tokens); an answer with no usage at all is
    charged what was ``reserved`` for it."""
    usage = got.usage
    pin, pout = cfg.price_in_per_mtok, cfg.price_out_per_mtok
    cost = (prompt_n * pin + counted * pout) / 1e6
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
    elif ct is not None and ct < counted * UNDER_REPORT - 4:
        note = "under"
    return cost, note
