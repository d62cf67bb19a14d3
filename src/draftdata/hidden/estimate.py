"""How many bytes a hidden-state capture will write, before anything runs (issue 28).

The bytes per token are the tensors each layout writes (``hidden.layouts``), at the stored
dtype, for the default ``--layers auto``: three aux layers and the last one, each of the target's
hidden size H.

- ``speculators``: ``hidden_states`` [S, 4, H], ``token_ids`` int64 [S]; fp8 adds
  ``hidden_states_scales`` float32 [S, 1, 1]. One safetensors file per sample.
- ``specforge``: ``hidden_state`` [1, S, H] and ``aux_hidden_state`` [1, S, 3H], ``input_ids`` and
  ``loss_mask`` int64 [S]. One ``torch.save`` file per sample.
- ``modelopt``: ``hidden_states`` [S, H] and ``aux_hidden_states`` [S, 3H], ``input_ids`` and
  ``loss_mask`` int64 [S]. One ``torch.save`` file per sample.
- ``safetensors`` (draftdata's own shards): ``hidden_states`` [T, 4, H], ``input_ids`` int64 and
  ``loss_mask`` uint8 [T] (fp8: scales as speculators); many samples per file.

A file's own header (safetensors' JSON header, torch.save's zip records) is a per-file constant,
measured once on the files the layouts write: about 160 bytes per speculators file, 1,500 per
SpecForge file. ``--codec zstd`` is not estimated (it depends on the states): on SmolLM2 it
stored fp8 shards in 0.83x their plain size (BENCHMARKS.md).

The tokens are measured where the run's ledger has answers (their prompt and completion tokens,
the mean per answer for the requests still to ask), and otherwise bounded from above (later
turns and answers at ``max_tokens``); both are given. The capture time comes from the rate
(tokens per second) a capture into the run's folder measured and recorded in its
``draftdata-hidden-states.json``; with none, no time is guessed."""

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
FILE_BYTES = {"speculators": 160, "specforge": 1500, "modelopt": 1500, "safetensors": 0}
#: what each layout stores per token beyond the hidden states: (ids and masks, fp8 scales)
EXTRA_BYTES = {
    "speculators": (8, 4),
    "specforge": (16, 0),
    "modelopt": (16, 0),
    "safetensors": (9, 4),
}
#: the layouts estimated, in the order the CLI names them
LAYOUTS = tuple(EXTRA_BYTES)


def bytes_per_token(layout: str, dtype: str, hidden_size: int) -> int:
    """The bytes one token takes in ``layout`` at ``dtype`` (headers aside)."""
    if layout not in EXTRA_BYTES:
        raise InputError(f"--hidden-for {layout!r}: choose one of {', '.join(LAYOUTS)}")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"--hidden-dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    ids, scales = EXTRA_BYTES[layout]
    return (
        STORED_LAYERS * hidden_size * DTYPE_BYTES[dtype] + ids + (scales if dtype == "fp8" else 0)
    )


@dataclass(frozen=True)
class CaptureRate:
    """A capture's measured rate, from the ``draftdata-hidden-states.json`` it wrote."""

    tokens_per_s: float
    device: str
    model: str
    #: the capture folder it was read from
    source: str


@dataclass(frozen=True)
class StorageEstimate:
    layout: str
    hidden_size: int
    samples: int
    #: tokens of every sample (prompt and answer): measured where the ledger has answers
    tokens: int
    #: the same, at most (later turns and answers at max_tokens)
    tokens_max: int
    #: answers the token count was measured on (0: ``tokens`` is the bound)
    measured_answers: int
    #: bytes per dtype at ``tokens``, and at ``tokens_max``
    bytes: dict[str, int]
    bytes_max: dict[str, int]
    rate: CaptureRate | None = None

    @property
    def capture_s(self) -> float | None:
        return self.tokens / self.rate.tokens_per_s if self.rate else None

    def to_json(self) -> dict[str, Any]:
        doc = {k: v for k, v in self.__dict__.items() if k != "rate"}
        doc["rate"] = dict(self.rate.__dict__) if self.rate else None
        doc["capture_s"] = None if self.capture_s is None else round(self.capture_s, 1)
        return doc

    def lines(self) -> list[str]:
        def per(b: dict[str, int]) -> str:
            return " / ".join(f"{human(n)} {dt}" for dt, n in b.items())

        head = f"hidden states ({self.layout}, hidden size {self.hidden_size:,}): "
        bound = (
            f"≤ {per(self.bytes_max)} for {self.samples:,} samples of ≤ {self.tokens_max:,} tokens"
        )
        if self.measured_answers:
            got = [
                f"{head}≈ {per(self.bytes)} for {self.samples:,} samples of ≈ {self.tokens:,} "
                f"tokens (measured on {self.measured_answers:,} answers; {bound})"
            ]
        else:
            got = [f"{head}{bound} in all (no answers yet to measure)"]
        if self.rate is None:
            got.append(
                "capture time: no rate measured yet (`draftdata hidden-states` records one in "
                "the run folder)"
            )
        else:
            assert self.capture_s is not None
            got.append(
                f"capture time: ≈ {duration(self.capture_s)} at {self.rate.tokens_per_s:,.0f} "
                f"tokens/s ({self.rate.device}, measured by {self.rate.source})"
            )
        return got


def estimate(
    layout: str,
    hidden_size: int,
    samples: int,
    tokens: int,
    tokens_max: int | None = None,
    measured_answers: int = 0,
    rate: CaptureRate | None = None,
) -> StorageEstimate:
    files = samples if layout != "safetensors" else 0
    top = tokens if tokens_max is None else tokens_max

    def size(n: int) -> dict[str, int]:
        return {
            dt: n * bytes_per_token(layout, dt, hidden_size) + files * FILE_BYTES[layout]
            for dt in ("bf16", "fp8")
        }

    return StorageEstimate(
        layout, hidden_size, samples, tokens, top, measured_answers, size(tokens), size(top), rate
    )


def capture_rate(run_dir: Path) -> CaptureRate | None:
    """The newest capture rate recorded under ``run_dir`` (its ``hidden-states-*`` folders)."""
    found = []
    for doc_path in Path(run_dir).glob("hidden-states-*/draftdata-hidden-states.json"):
        try:
            doc = json.loads(doc_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        rate = doc.get("tokens_per_s") if isinstance(doc, dict) else None
        if isinstance(rate, (int, float)) and rate > 0:
            found.append((doc_path.stat().st_mtime, doc_path.parent, doc, float(rate)))
    if not found:
        return None
    _, folder, doc, rate = max(found, key=lambda f: f[0])
    return CaptureRate(rate, str(doc.get("device", "?")), str(doc.get("model", "?")), folder.name)


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"


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
