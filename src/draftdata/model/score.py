"""Teacher-forced log-probabilities from the target model, batched by length.

``Scorer.logprobs`` runs one forward pass per batch of sequences (sorted by length, right-padded,
an attention mask, positions from 0) and returns, for each sequence, ``log p(ids[j] | ids[:j])``
for every ``j >= 1``: float32 log-softmax of the logits, on CPU in float32, on CUDA in the
model's dtype (bfloat16 by default). Right padding never changes the positions before it, so a
row's figures are those of a forward pass over that row alone, up to float rounding.

``Scorer.session`` holds one sequence with its KV cache for the repair walk: the logits of every
position of the answer, and ``replace_from`` to change the ids from one position on while
reusing the cache of the prefix.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from ..records import Decoding
from .folders import ModelError
from .load import LoadedModel, load_causal_lm
from .rows import GoOn, TorchRow, possible_rows

__all__ = ["Scorer", "Session", "fits_model", "length_batches", "load_scorer", "right_padded"]

#: logits held at once by one batch (batch x length x vocabulary floats): about 1 GiB in float32
MAX_LOGITS = 1 << 28


def length_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Indices, longest first, grouped so a batch holds at most ``max_tokens`` once padded to
    its longest (a sequence longer than that is a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for i in order:
        width = lengths[batch[0]] if batch else lengths[i]
        if batch and (len(batch) + 1) * width > max_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def right_padded(lm: LoadedModel, seqs: Sequence[Sequence[int]]) -> tuple[Any, Any]:
    """``(ids, attention_mask)`` long tensors [len(seqs), longest], padded on the right."""
    torch = lm.torch
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), lm.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[row, : len(s)] = 1
    return ids, mask


def load_scorer(spec: str, *, device: str = "cpu", dtype: str | None = None) -> Scorer:
    """Load ``spec`` (folder, GGUF converted once, or ``pkg:``) and score with it (a server's
    URL: ``generate.scoring.open_scorer``)."""
    return Scorer(load_causal_lm(spec, device=device, dtype=dtype))


def fits_model(
    ids: Sequence[int], vocab_size: int, max_positions: int | None, what: str, verb: str
) -> None:
    """Refuse ``ids`` a model of ``vocab_size`` ids and ``max_positions`` positions cannot take
    whole, in one line that names ``what`` and the fix (``verb``: what the caller does with
    them, score or capture). The one id-in-vocabulary check before a model's forward."""
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        raise ModelError(
            f"{what} holds token id {low if low < 0 else high}, outside the model's vocabulary "
            f"of {vocab_size}; {verb} with the model these ids were made for"
        )
    if max_positions is not None and len(ids) > max_positions:
        raise ModelError(
            f"{what} has {len(ids)} tokens, past the model's {max_positions} positions; it "
            f"cannot be {'scored' if verb == 'score' else 'captured'} whole"
        )


class Scorer:
    """Score token ids with a loaded causal LM."""

    concurrency = 1

    def __init__(self, lm: LoadedModel, *, max_logits: int = MAX_LOGITS) -> None:
        self.lm = lm
        self.max_logits = max_logits
        self.key = str(lm.folder)

    def check(self, ids: Sequence[int], what: str = "sequence") -> None:
        if not ids:
            raise ModelError(f"{what} is empty; there is nothing to score")
        fits_model(ids, self.lm.vocab_size, self.lm.max_positions, what, "score")

    def batches(self, lengths: Sequence[int]) -> Iterator[list[int]]:
        """Indices grouped by length (longest first) so no batch holds more than ``max_logits``."""
        return length_batches(lengths, self.max_logits // self.lm.vocab_size)

    def logprobs(self, seqs: Sequence[Sequence[int]]) -> list[list[float]]:
        """``out[i][j-1] = log p(seqs[i][j] | seqs[i][:j])`` for ``j`` in ``1..len-1``."""
        for n, s in enumerate(seqs):
            self.check(s, f"sequence {n}")
        out: list[list[float]] = [[] for _ in seqs]
        torch = self.lm.torch
        for batch in self.batches([len(s) for s in seqs]):
            ids, mask = right_padded(self.lm, [seqs[i] for i in batch])
            with torch.inference_mode():
                logits = self.lm.model(
                    input_ids=ids.to(self.lm.device), attention_mask=mask.to(self.lm.device)
                ).logits
                lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
                got = lp.gather(-1, ids[:, 1:, None].to(lp.device))[..., 0].cpu()
            for row, i in enumerate(batch):
                out[i] = got[row, : len(seqs[i]) - 1].tolist()
        return out

    def session(self, ids: Sequence[int], first: int) -> Session:
        """A forward pass over ``ids`` keeping the cache and the logits that predict positions
        ``first`` and on (``first >= 1``)."""
        return Session(self, list(ids), first)


class Session:
    """One sequence, its KV cache and the logits predicting each position from ``first`` on."""

    def __init__(self, scorer: Scorer, ids: list[int], first: int) -> None:
        if not 1 <= first <= len(ids):
            raise ModelError(f"cannot score from position {first} of {len(ids)}")
        scorer.check(ids)
        self.lm = scorer.lm
        self.ids = ids
        self.first = first
        self.forwards = 0
        self.tokens_forwarded = 0
        torch = self.lm.torch
        logits, self.cache = self._forward(ids, None, 0)
        lp = torch.log_softmax(logits[: first - 1], dim=-1)
        idx = torch.tensor(ids[1:first], dtype=torch.long, device=lp.device)
        #: log p(ids[j] | ids[:j]) for j in 1..first-1 (the prompt, read once and not kept)
        self.prefix_logprobs: list[float] = lp.gather(-1, idx[:, None])[:, 0].tolist()
        del lp
        # rows[k] predicts ids[first + k]; the last row predicts past the end
        self.rows = logits[first - 1 :].clone()
        del logits

    def _forward(self, ids: Sequence[int], cache: Any, keep: int) -> tuple[Any, Any]:
        torch = self.lm.torch
        start = cache.get_seq_length() if cache is not None else 0
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.lm.device)
        kwargs: dict[str, Any] = {"use_cache": True, "logits_to_keep": keep}  # 0: every row
        if cache is not None:
            kwargs[self.lm.cache_kw] = cache
        positions = torch.arange(start, start + len(ids), device=self.lm.device)[None, :]
        with torch.inference_mode():
            out = self.lm.model(input_ids=x, position_ids=positions, **kwargs)
        self.forwards += 1
        self.tokens_forwarded += len(ids)
        new_cache = getattr(out, "cache", None)
        return out.logits[0].float(), (new_cache if new_cache is not None else out.past_key_values)

    def row(self, j: int) -> TorchRow:
        """The distribution predicting position ``j`` (``j >= first``)."""
        return TorchRow(self.lm.torch, self.rows[j - self.first])

    def possible(self, j: int, decoding: Decoding, greedy: bool) -> list[bool]:
        """For each position from ``j`` to the end: could ``decoding`` have produced its id?"""
        rows = self.rows[j - self.first : len(self.ids) - self.first]
        return possible_rows(self.lm.torch, rows, self.ids[j:], decoding, greedy)

    def replace_from(self, j: int, tail: Sequence[int]) -> None:
        """Set ``ids[j:] = tail`` and recompute the logits after ``j``, reusing the prefix cache.

        The row predicting ``ids[j]`` depends only on ``ids[:j]`` and stays as it is."""
        if not self.first <= j < len(self.ids) + 1 or not tail:
            raise ModelError(f"cannot replace from position {j} with {len(tail)} ids")
        torch = self.lm.torch
        drop = self.cache.get_seq_length() - j
        if drop > 0:  # transformers 5 crops by a negative count of tokens to remove
            self.cache.crop(-drop)
        new, self.cache = self._forward(tail, self.cache, len(tail))
        self.rows = torch.cat([self.rows[: j - self.first + 1], new], dim=0)
        self.ids = self.ids[:j] + list(tail)

    def peek(self, j: int, tokens: Sequence[int]) -> Any:
        """The logits after each of ``tokens`` put at position ``j`` (row k predicts what follows
        ``tokens[k]``), leaving the session as it was: the cache's tensors are kept aside and
        put back (a forward pass only ever makes new ones)."""
        saved = [(layer.keys, layer.values) for layer in self.cache.layers]
        try:
            drop = self.cache.get_seq_length() - j
            if drop > 0:
                self.cache.crop(-drop)
            logits, _ = self._forward(tokens, self.cache, len(tokens))
        finally:
            for layer, (k, v) in zip(self.cache.layers, saved, strict=True):
                layer.keys, layer.values = k, v
        return logits

    def peek_many(
        self, paths: Sequence[tuple[int, Sequence[int]]], go_on: GoOn | None = None
    ) -> list[list[TorchRow]]:
        """The distributions along each path ``(j, path)`` put at position ``j``: per path, the
        rows predicting ``path[1:]`` (row k follows ``path[k]``; ``go_on`` is not needed: every
        path's rows come from one pass). One forward pass for all:
        ``path[:-1]`` of each sees the cached ids before ``j`` and its own tokens (a tree
        attention mask over the cache), and nothing of the other paths."""
        paths = [(j, list(p)[:-1]) for j, p in paths]
        if not paths:
            return []
        torch = self.lm.torch
        n = self.cache.get_seq_length()
        flat: list[int] = []
        positions: list[int] = []
        starts: list[int] = []
        for j, tokens in paths:
            if not 0 < j <= n or not tokens:
                raise ModelError(f"cannot peek at position {j} of {n} with {len(tokens)} ids")
            starts.append(len(flat))
            flat += list(tokens)
            positions += range(j, j + len(tokens))
        q = len(flat)
        mask = torch.zeros((1, 1, q, n + q), dtype=torch.bool)
        for (j, tokens), o in zip(paths, starts, strict=True):
            m = len(tokens)
            mask[0, 0, o : o + m, :j] = True
            mask[0, 0, o : o + m, n + o : n + o + m] = torch.ones((m, m), dtype=torch.bool).tril()
        saved = [(layer.keys, layer.values) for layer in self.cache.layers]
        x = torch.tensor([flat], dtype=torch.long, device=self.lm.device)
        pos = torch.tensor([positions], dtype=torch.long, device=self.lm.device)
        try:
            with torch.inference_mode():
                out = self.lm.model(
                    input_ids=x,
                    position_ids=pos,
                    attention_mask=mask.to(self.lm.device),
                    use_cache=True,
                    **{self.lm.cache_kw: self.cache},
                )
        finally:
            for layer, (k, v) in zip(self.cache.layers, saved, strict=True):
                layer.keys, layer.values = k, v
        self.forwards += 1
        self.tokens_forwarded += q
        logits = out.logits[0].float()
        torch = self.lm.torch
        return [
            [TorchRow(torch, r) for r in logits[o : o + len(t)]]
            for (_j, t), o in zip(paths, starts, strict=True)
        ]

    def logprobs(self) -> list[float]:
        """``log p(ids[j] | ids[:j])`` for ``j`` from ``first`` to the end."""
        torch = self.lm.torch
        lp = torch.log_softmax(self.rows[:-1], dim=-1)
        idx = torch.tensor(self.ids[self.first :], dtype=torch.long, device=lp.device)
        return [
            float(v) if math.isfinite(v) else -math.inf
            for v in lp.gather(-1, idx[:, None])[:, 0].tolist()
        ]
