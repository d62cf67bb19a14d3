"""How many bytes a hidden-state capture will write, before anything runs (issue 28).

The bytes per token are the tensors each layout writes (``hidden.layouts``), at the stored
dtype, for the default ``--layers auto``: three aux layers and the last one, each of the target's
hidden size H.

- ``speculators``: ``hidden_states`` [S, 4, H], ``token_ids`` int64 [S]; fp8 adds
  ``hidden_states_scales`` float32 [S, 1, 1]. One safetensors file per sample.
- ``specforge``: ``hidden_state`` [1, S, H] and ``aux_hidden_state`` [1, S, 3H], ``input_ids`` and
  ``loss_mask`` int64 [S]. One ``torch.save`` file per sample.
- ``safetensors`` (draftdata's own shards): ``hidden_states`` [T, 4, H], ``input_ids`` int64 and
  ``loss_mask`` uint8 [T] (fp8: scales as speculators); many samples per file.

A file's own header (safetensors' JSON header, torch.save's zip records) is a per-file constant,
measured once on the files the layouts write: about 160 bytes per speculators file, 1,500 per
SpecForge file. ``--codec zstd`` is not estimated (it depends on the states): on SmolLM2 it
stored fp8 shards in 0.83x their plain size (BENCHMARKS.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

DTYPE_BYTES = {"bf16": 2, "fp32": 4, "fp8": 1}
#: stored layers with --layers auto: three aux layers and the last
STORED_LAYERS = 4
#: a file's own bytes beyond its tensors, measured on the files the layouts write
FILE_BYTES = {"speculators": 160, "specforge": 1500, "safetensors": 0}
#: what each layout stores per token beyond the hidden states: (ids and masks, fp8 scales)
EXTRA_BYTES = {"speculators": (8, 4), "specforge": (16, 0), "safetensors": (9, 4)}


def bytes_per_token(layout: str, dtype: str, hidden_size: int) -> int:
    """The bytes one token takes in ``layout`` at ``dtype`` (headers aside)."""
    if layout not in EXTRA_BYTES:
        raise InputError(f"--hidden-for {layout!r}: choose one of {', '.join(EXTRA_BYTES)}")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"--hidden-dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    ids, scales = EXTRA_BYTES[layout]
    return (
        STORED_LAYERS * hidden_size * DTYPE_BYTES[dtype] + ids + (scales if dtype == "fp8" else 0)
    )


@dataclass(frozen=True)
class StorageEstimate:
    layout: str
    hidden_size: int
    samples: int
    #: tokens of every sample (prompt and answer), at most: later turns and answers at max_tokens
    tokens: int
    #: bytes per dtype, at most
    bytes: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def line(self) -> str:
        per = " / ".join(f"{human(b)} {dt}" for dt, b in self.bytes.items())
        return (
            f"hidden states ({self.layout}, hidden size {self.hidden_size:,}): ≤ {per} for "
            f"{self.samples:,} samples of ≤ {self.tokens:,} tokens in all"
        )


def estimate(layout: str, hidden_size: int, samples: int, tokens: int) -> StorageEstimate:
    files = samples if layout != "safetensors" else 0
    got = {
        dt: tokens * bytes_per_token(layout, dt, hidden_size) + files * FILE_BYTES[layout]
        for dt in ("bf16", "fp8")
    }
    return StorageEstimate(layout, hidden_size, samples, tokens, got)


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError


def hidden_size_of(spec: str) -> int:
    """The hidden size of a model (a transformers folder's config.json, or a GGUF's metadata),
    without loading its weights."""
    from ..model.folders import resolve_model

    folder, gguf_name = resolve_model(spec)
    if gguf_name is None:
        cfg = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        cfg = cfg.get("text_config", cfg)
        if not isinstance(cfg.get("hidden_size"), int):
            raise InputError(f"{spec}: config.json has no hidden_size; pass --hidden-size")
        return int(cfg["hidden_size"])
    import gguf

    reader = gguf.GGUFReader(str(Path(folder) / gguf_name))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    field = reader.fields.get(f"{arch}.embedding_length")
    if field is None:
        raise InputError(f"{spec}: the GGUF names no embedding length; pass --hidden-size")
    return int(field.parts[-1][0])
