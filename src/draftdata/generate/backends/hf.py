"""The local transformers engine: exact output ids from a plain batched decode loop.

The loop is the one the SmolLM2 ground truth was made with (see ``shared/data/groundtruth``):
left-padded prompts with an attention mask and explicit position ids, one prefill, a KV cache,
then one token per row per step. Temperature 0 is greedy (arg-max). Above 0 it is
softmax(logits / T), the top-p nucleus (the most probable ids, in rank order, until their mass
reaches top_p) renormalised, and ``torch.multinomial`` over that rank-ordered nucleus with a
per-row ``torch.Generator`` seeded by the caller: that reproduces the sampled ground-truth
records, while a draw over the vocabulary-ordered distribution (what ``model.generate`` does)
picks other ids from the same seed. No other logits processing.

A row stops at a stop id (kept as its last output id) or after ``max_new_tokens``. The caller
chooses the batches; rows of one batch never see each other, but float32 results can differ in
the last bits between batch shapes, so a prompt can decode differently in another batch.

torch and transformers are imported when an engine is made, never at module import.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from ...model.folders import ModelError
from ...model.load import load_causal_lm

__all__ = ["EngineOutput", "HFEngine"]

#: how a local engine ends an answer (a server may also say tool_calls)
EngineFinish = Literal["stop", "length"]


class GenerationCancelled(Exception):
    """The caller asked the engine to stop (Ctrl-C): the batch in flight is abandoned."""


@dataclass(frozen=True)
class EngineOutput:
    """The generated ids of one prompt, a final stop id included, and why generation ended."""

    output_ids: list[int]
    finish_reason: EngineFinish


class HFEngine:
    """A causal LM loaded with transformers (a model folder or a GGUF), generating from prompt ids.

    ``model`` is any spec :func:`draftdata.models.resolve_model` takes. A GGUF is dequantised on
    load. ``device`` is ``cpu`` or ``cuda`` (``cuda:N``); on CPU the weights are float32 and torch
    uses every core this process may run on, unless ``threads`` says otherwise.
    """

    name: ClassVar[str] = "hf"

    def __init__(
        self,
        model: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
    ) -> None:
        lm = load_causal_lm(model, device=device, dtype=dtype, threads=threads, convert=False)
        self.spec = lm.spec
        self.folder, self.gguf_file = lm.folder, lm.gguf_file
        self.device, self.dtype = lm.device, lm.dtype
        self.model: Any = lm.model
        self._torch: Any = lm.torch
        self.vocab_size: int = lm.vocab_size
        self.max_positions: int | None = lm.max_positions
        self._pad_id: int = lm.pad_id
        self._cache_kw = lm.cache_kw

    def __repr__(self) -> str:
        return f"HFEngine({self.spec!r}, device={self.device!r}, dtype={self.dtype!r})"

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seeds: Sequence[int] | None = None,
        stop_ids: AbstractSet[int],
        cancel: threading.Event | None = None,
    ) -> list[EngineOutput]:
        """Generate for one batch of prompts (token ids), one output per prompt, in order.

        ``temperature`` 0 is greedy; above 0 sampling needs one seed per prompt, and a row with
        the same prompt, seed and batch shape gives the same ids every time. ``cancel`` is
        checked between decode steps: once set, the batch stops with ``GenerationCancelled``.
        """
        self._check_request(prompts, max_new_tokens, temperature, top_p, seeds)
        if not prompts:
            return []
        torch = self._torch
        rows, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((rows, width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = mask.cumsum(-1) - 1
        positions.masked_fill_(mask == 0, 1)
        generators = None
        if temperature > 0 and seeds is not None:
            generators = [torch.Generator(device=self.device).manual_seed(int(s)) for s in seeds]

        outputs: list[list[int]] = [[] for _ in range(rows)]
        finish: list[EngineFinish | None] = [None] * rows
        with torch.inference_mode():
            step_out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
            while True:
                if cancel is not None and cancel.is_set():
                    raise GenerationCancelled("generation cancelled between decode steps")
                cache = _cache_of(step_out)
                logits = step_out.logits[:, -1, :].float()
                picked = self._pick(logits, temperature, top_p, generators, finish)
                for i, token in enumerate(picked):
                    if finish[i] is not None:
                        continue
                    outputs[i].append(token)
                    if token in stop_ids:
                        finish[i] = "stop"
                    elif len(outputs[i]) >= max_new_tokens:
                        finish[i] = "length"
                if all(f is not None for f in finish):
                    break
                fed = [self._pad_id if finish[i] else t for i, t in enumerate(picked)]
                mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=-1)
                positions = positions[:, -1:] + 1
                step_out = self.model(
                    input_ids=torch.tensor(fed, dtype=torch.long, device=self.device)[:, None],
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=1,
                    **{self._cache_kw: cache},
                )
        reasons = [reason for reason in finish if reason is not None]
        return [
            EngineOutput(output_ids=ids, finish_reason=reason)
            for ids, reason in zip(outputs, reasons, strict=True)
        ]

    def _pick(
        self,
        logits: Any,
        temperature: float,
        top_p: float,
        generators: list[Any] | None,
        finish: list[EngineFinish | None],
    ) -> list[int]:
        """One next id per row: arg-max, or a draw from the temperature / top-p distribution."""
        torch = self._torch
        if generators is None:
            return [int(t) for t in torch.argmax(logits, dim=-1).tolist()]
        probs = torch.softmax(logits / temperature, dim=-1)
        ranked, order = torch.sort(probs, dim=-1, descending=True)
        if top_p < 1.0:
            # the nucleus: the most probable ids until their mass reaches top_p (a prefix of the
            # ranking, since the mass before an id only grows down the ranking)
            mass_before = torch.cumsum(ranked, dim=-1) - ranked
            kept = (mass_before < top_p).sum(dim=-1).tolist()
        else:
            kept = [ranked.shape[-1]] * ranked.shape[0]
        picked: list[int] = []
        for i, generator in enumerate(generators):
            if finish[i] is not None:  # a finished row draws nothing, so its stream stays put
                picked.append(self._pad_id)
                continue
            # Draw from the renormalised nucleus in rank order, as the ground truth was drawn:
            # multinomial over a zero-padded or vocabulary-ordered vector picks other ids.
            nucleus = ranked[i, : int(kept[i])]
            nucleus = nucleus / nucleus.sum()
            rank = int(torch.multinomial(nucleus, 1, generator=generator).item())
            picked.append(int(order[i, rank].item()))
        return picked

    def _check_request(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seeds: Sequence[int] | None,
    ) -> None:
        if max_new_tokens < 1:
            raise ModelError(f"max_new_tokens is {max_new_tokens}; ask for at least 1 new token")
        if not math.isfinite(temperature) or temperature < 0:
            raise ModelError(f"temperature is {temperature}; use 0 for greedy or a positive number")
        if not 0 < top_p <= 1:
            raise ModelError(f"top_p is {top_p}; use a number in (0, 1], 1 for no nucleus cut")
        if temperature > 0 and (seeds is None or len(seeds) != len(prompts)):
            got = "none" if seeds is None else str(len(seeds))
            raise ModelError(
                f"sampling at temperature {temperature} needs one seed per prompt "
                f"({len(prompts)} prompts, {got} seeds); pass seeds=[...] so the draw is "
                "reproducible"
            )
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ModelError(f"prompt {i} is empty; every prompt needs at least one token id")
            low, high = min(prompt), max(prompt)
            if low < 0 or high >= self.vocab_size:
                raise ModelError(
                    f"prompt {i} holds token id {low if low < 0 else high}, outside this model's "
                    f"vocabulary of {self.vocab_size}; encode it with the model's own tokenizer"
                )
            if self.max_positions is not None and len(prompt) + max_new_tokens > self.max_positions:
                raise ModelError(
                    f"prompt {i} has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} "
                    f"it passes the model's {self.max_positions} positions; drop the prompt or "
                    "lower max_new_tokens"
                )


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
