"""Ids from the tokens a server reports in ``logprobs``: vLLM's ``token_id:N`` gives the id, an
OpenAI-style ``bytes`` list gives the token's raw bytes, looked up among ordinary tokens. A token
that cannot be mapped exactly makes the whole answer fall back to reconstruction (counted)."""

from __future__ import annotations

from ..formats import BoundFormat
from ..records import ApiView


def ids_from_logprobs(bound: BoundFormat, view: ApiView) -> tuple[list[int] | None, str | None]:
    """Map logprob tokens to ids exactly (vLLM ``token_id:N``, or the token's raw bytes).
    Returns (ids, None) or (None, reason) when a token cannot be mapped."""
    if not view.logprobs:
        return None, "no_logprobs"
    tok = bound.tokenizer
    index = tok.ordinary_ids_by_bytes
    ids: list[int] = []
    for lp in view.logprobs:
        if lp.id is not None:
            if not 0 <= lp.id < tok.vocab_size:
                return None, "id_out_of_vocabulary"
            ids.append(lp.id)
            continue
        info = tok.control_by_text.get(lp.token)
        if info is not None and lp.bytes in (None, tuple(lp.token.encode())):
            ids.append(info.id)
            continue
        raw = bytes(lp.bytes) if lp.bytes is not None else None
        if raw is None:
            if "\ufffd" in lp.token:
                return None, "logprob_token_without_bytes"
            raw = lp.token.encode()
        tid = index.get(raw)
        if tid is None:
            return None, "logprob_bytes_not_in_vocabulary"
        ids.append(tid)
    return bound.closed(ids, view.finish_reason), None
