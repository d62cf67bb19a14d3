"""One forward pass per batch that yields, for each sequence, the EAGLE-3 hidden states and the
teacher-forced log-probabilities of its own ids (the verification of the model stage, from the
same logits).

Forward hooks on the decoder layers keep only the layers asked for (``output_hidden_states``
would hold all of them); the final norm's output is the post-norm last layer. Batches are sorted
by length and right-padded, so every row's states are those of a forward over that row alone,
up to float rounding. On CPU every sequence is its own forward: padding there costs more than
batching saves (one at a time was 2.3x faster on 32 SmolLM2 records), and a sequence alone is
bitwise what a plain transformers forward over it gives."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..model.folders import ModelError
from ..model.load import LoadedModel
from ..model.score import length_batches, right_padded
from .layers import Layers

__all__ = ["Captured", "Capturer"]

#: tokens in one batch on CUDA; the logits of a batch are its tokens x the vocabulary
BATCH_TOKENS = 16384


@dataclass
class Captured:
    """One sequence: ``aux`` [S, k, H], ``last`` [S, H] before the final norm, ``last_normed``
    [S, H] after it (torch tensors on the model's device, in its dtype), and
    ``logprobs[j - 1] = log p(ids[j] | ids[:j])``; ``logits`` [S, V], the model's logits over
    the sequence, only where the capturer was asked to keep them (NeMo Automodel's cache
    stores the target's distribution)."""

    aux: Any
    last: Any
    last_normed: Any
    logprobs: list[float]
    logits: Any = None


def _decoder(model: Any) -> Any:
    dec = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    if dec is None or not hasattr(dec, "layers") or not hasattr(dec, "norm"):
        raise ModelError(
            f"{type(model).__name__}: no decoder layers and final norm found (model.layers and "
            "model.norm); hidden-state capture supports decoder-only transformers models"
        )
    return dec


def n_layers_of(lm: LoadedModel) -> int:
    return len(_decoder(lm.model).layers)


class Capturer:
    """Capture ``layers`` from ``lm`` over token ids."""

    def __init__(
        self,
        lm: LoadedModel,
        layers: Layers,
        *,
        batch_tokens: int | None = None,
        keep_logits: bool = False,
    ):
        dec = _decoder(lm.model)
        if layers.n_layers != len(dec.layers):
            raise ModelError(
                f"layers were chosen for {layers.n_layers} layers; the model has {len(dec.layers)}"
            )
        self.lm = lm
        self.layers = layers
        self.keep_logits = keep_logits
        # 1: every sequence alone (the CPU default)
        self.batch_tokens = batch_tokens or (1 if lm.device == "cpu" else BATCH_TOKENS)
        self._out: dict[str, Any] = {}
        self._hooks = []
        wanted = {i - 1: f"aux{n}" for n, i in enumerate(layers.aux)}
        wanted[layers.n_layers - 1] = "last"  # aux layers are below L, never the last one
        for idx, name in wanted.items():
            self._hooks.append(dec.layers[idx].register_forward_hook(self._keep(name)))
        self._hooks.append(dec.norm.register_forward_hook(self._keep("normed")))

    def _keep(self, name: str) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            self._out[name] = output[0] if isinstance(output, tuple) else output

        return hook

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def capture(self, seqs: Sequence[Sequence[int]]) -> Iterator[tuple[int, Captured]]:
        """``(i, Captured)`` for every sequence, batch by batch (not in input order)."""
        torch = self.lm.torch
        for batch in length_batches([len(s) for s in seqs], self.batch_tokens):
            ids, mask = right_padded(self.lm, [seqs[i] for i in batch])
            self._out.clear()
            dev = self.lm.device
            done: list[tuple[int, Captured]] = []
            with torch.inference_mode():
                logits = self.lm.model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
                out = dict(self._out)
                self._out.clear()
                aux = torch.stack([out[f"aux{n}"] for n in range(len(self.layers.aux))], dim=2)
                for row, i in enumerate(batch):
                    n = len(seqs[i])
                    lg = logits[row, : n - 1].float()
                    tgt = ids[row, 1:n].to(lg.device)
                    lp = lg.gather(-1, tgt[:, None])[:, 0] - torch.logsumexp(lg, dim=-1)
                    done.append(
                        (
                            i,
                            Captured(
                                aux[row, :n],
                                out["last"][row, :n],
                                out["normed"][row, :n],
                                lp.cpu().tolist(),
                                logits[row, :n] if self.keep_logits else None,
                            ),
                        )
                    )
                del logits, out, aux
            yield from done
