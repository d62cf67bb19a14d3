"""Which layers EAGLE-3 reads, in one numbering with each trainer's own beside it.

draftdata numbers layers as transformers' ``output_hidden_states`` does: 0 is the embedding
output, ``i`` (1..L) the output of decoder layer ``i - 1``. The auxiliary layers are
``[2, L // 2, L - 3]`` by default (both trainers capture these); the last layer is ``L``, taken
before the final norm (what speculators stores) and after it (what SpecForge stores, and what
transformers returns as ``hidden_states[L]``). SpecForge names the same aux layers
``[1, L // 2 - 1, L - 4]`` (it hooks the input of layer ``i + 1``); speculators names them as we
do. ModelOpt (``default_eagle_aux_layer_ids``, its ``eagle_aux_hidden_state_layer_ids``) and NeMo
Automodel (``default_eagle3_aux_layer_ids``) name them 0-based as SpecForge does and hook the
outputs of those decoder layers: the same states."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

__all__ = ["Layers", "n_layers_in", "parse_layers"]


def _config_int(folder: Path, key: str) -> int:
    """``key`` of a model folder's config.json (or its ``text_config``), read before any load."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{folder}: no readable config.json ({e})") from e
    n = cfg.get(key) or (cfg.get("text_config") or {}).get(key)
    if not isinstance(n, int):
        raise InputError(f"{folder}/config.json has no {key}")
    return n


def n_layers_in(folder: Path) -> int:
    """The decoder layers a model folder's config.json declares (read before any load)."""
    return _config_int(folder, "num_hidden_layers")


def vocab_size_in(folder: Path) -> int:
    """The target vocabulary a model folder's config.json declares."""
    return _config_int(folder, "vocab_size")


@dataclass(frozen=True)
class Layers:
    aux: tuple[int, ...]
    n_layers: int

    @property
    def last(self) -> int:
        return self.n_layers

    def to_json(self) -> dict[str, Any]:
        return {
            "numbering": "transformers hidden_states: 0 = embedding output, i = output of "
            "decoder layer i-1",
            "n_layers": self.n_layers,
            "aux": list(self.aux),
            "last": self.last,
            "specforge_aux_layer_ids": [i - 1 for i in self.aux],
            # ModelOpt's eagle_aux_hidden_state_layer_ids (0-based decoder layers)
            "modelopt_aux_layer_ids": [i - 1 for i in self.aux],
            "speculators_layer_ids": [*self.aux, self.last],
        }


def parse_layers(spec: str, n_layers: int) -> Layers:
    """``auto`` or ``i,j,k`` (transformers numbering, each in 1..L-1)."""
    if n_layers < 2:
        raise InputError(f"the model has {n_layers} layer; capture needs at least 2")
    if spec.strip() == "auto":
        auto = (2, n_layers // 2, n_layers - 3)
        if len(set(auto)) < 3 or auto[-1] < 1:
            raise InputError(
                f"--layers auto: {n_layers} layers are too few for three distinct aux layers "
                "[2, L//2, L-3]; give --layers i,j,k"
            )
        return Layers(auto, n_layers)
    try:
        aux = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise InputError(
            f"--layers {spec!r}: give auto or comma-separated layer numbers such as 2,15,27"
        ) from None
    bad = [i for i in aux if not 1 <= i < n_layers]
    if bad or not aux or len(set(aux)) != len(aux):
        raise InputError(
            f"--layers {spec!r}: aux layers must be distinct numbers in 1..{n_layers - 1} "
            f"(transformers numbering: 0 is the embedding output, {n_layers} the last layer, "
            "which is always captured)"
        )
    return Layers(tuple(sorted(aux)), n_layers)
