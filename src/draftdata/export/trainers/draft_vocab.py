"""The draft vocabulary from exact ids: the token frequencies a trainer counts over the trained
ids (``loss_mask`` 1) and the ``d2t`` / ``t2d`` mapping it builds from them, each in the trainer's
own files and by its own rule, so that a drafter's vocabulary is chosen from the ids the target
produced, not from a re-tokenized text.

- speculators 0.9.0 (``train/vocab_mapping.py``): ``token_freq.pt`` (``torch.save`` of
  ``{id: count}``), which ``speculators train --draft-vocab-size D`` reads from its
  ``--data-path``, and the mapping it would cache there, ``d2t-D.npy`` / ``t2d-D.npy``: the ids
  ranked by (count descending, id ascending), the top D, padded with the lowest unused ids where
  fewer than D were trained, sorted; ``d2t[i] = id_i - i`` (int64), ``t2d`` one bool per target id.
- SpecForge 0.2.0 (``data/preprocessing.py`` ``generate_vocab_mapping_file`` and
  ``process_token_dict_to_mappings``): ``vocab_mapping.pt``, ``torch.save({"d2t", "t2d"})``. Its
  rank is ``Counter.most_common``: count descending, ties in the order the ids were first
  counted (each row's distinct trained ids in ascending order, row after row), the missing ids
  ``0..D-1`` added at count 0 first where fewer than D ids were trained.

The two rules choose different ids only among ties at the boundary; each file follows its own
trainer's, checked against the trainer's own code by ``tests/test_draft_vocab.py``."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...files import atomic_path

#: speculators' token frequency file, read from ``--data-path`` (``--token-freq-path``)
TOKEN_FREQ = "token_freq.pt"
#: SpecForge's mapping file (``--vocab-mapping-path`` / its cache's ``vocab_mapping.pt``)
SPECFORGE_MAPPING = "vocab_mapping.pt"
_VOCAB_FILE = re.compile(r"^(token_freq\.pt|vocab_mapping\.pt|[dt]2[td]-\d+\.npy)$")


def is_vocab_file(rel: str) -> bool:
    """Whether a file a capture lists (its path relative to the output) is a draft vocabulary
    file written beside the states, which holds no sample."""
    return _VOCAB_FILE.match(rel) is not None


@dataclass
class TrainedCounts:
    """Each trained id's count, and the order ids were first counted (SpecForge's tie order)."""

    counts: Counter[int] = field(default_factory=Counter)
    first_seen: dict[int, None] = field(default_factory=dict)

    def add(self, ids: Sequence[int], mask: Sequence[bool | int]) -> None:
        trained = Counter(int(t) for t, m in zip(ids, mask, strict=True) if m)
        for t in sorted(trained):
            self.first_seen.setdefault(t, None)
        self.counts.update(trained)

    @classmethod
    def of(cls, rows: Iterable[tuple[Sequence[int], Sequence[bool | int]]]) -> TrainedCounts:
        out = cls()
        for ids, mask in rows:
            out.add(ids, mask)
        return out


def check_size(size: int | None, vocab: int) -> None:
    if size is not None and not 1 <= size <= vocab:
        raise InputError(
            f"--draft-vocab {size}: give a size from 1 to the target's vocabulary ({vocab})"
        )


def speculators_ids(c: TrainedCounts, size: int) -> list[int]:
    """The draft vocabulary (target ids, ascending) by speculators' rule."""
    ranked = sorted(c.counts, key=lambda t: (-c.counts[t], t))[:size]
    chosen = set(ranked)
    for t in range(size):
        if len(ranked) >= size:
            break
        if t not in chosen:
            ranked.append(t)
            chosen.add(t)
    return sorted(ranked)


def specforge_ids(c: TrainedCounts, size: int) -> list[int]:
    """The draft vocabulary (target ids, ascending) by SpecForge's rule."""
    order = list(c.first_seen)
    counts = dict(c.counts)
    if len(order) < size:
        for t in range(size):  # its missing ids, at count 0, before any later tie
            if len(order) >= size:
                break
            if t not in counts:
                counts[t] = 0
                order.append(t)
    # Counter.most_common(n): sorted by count, descending, stable over the counting order
    ranked = sorted(order, key=lambda t: -counts[t])[:size]
    return sorted(ranked)


def mapping(ids: list[int], vocab: int) -> tuple[list[int], list[bool]]:
    """``d2t`` (draft index -> target id offset) and ``t2d`` (target id -> in the draft)."""
    d2t = [t - i for i, t in enumerate(ids)]
    t2d = [False] * vocab
    for t in ids:
        t2d[t] = True
    return d2t, t2d


def top_overlap(a: TrainedCounts, b: TrainedCounts, size: int) -> int:
    """How many of the ``size`` most trained ids of ``a`` are among those of ``b`` (speculators'
    rank): what re-tokenizing the same text changes in a drafter's vocabulary."""
    return len(set(speculators_ids(a, size)) & set(speculators_ids(b, size)))


def _save(torch: Any, obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        torch.save(obj, f)


def write_speculators(
    folder: Path, c: TrainedCounts, vocab: int, size: int | None, torch: Any
) -> list[Path]:
    """``token_freq.pt`` and, with ``size``, ``d2t-{size}.npy`` / ``t2d-{size}.npy``."""
    import numpy as np

    written = [folder / TOKEN_FREQ]
    _save(torch, {int(t): int(n) for t, n in sorted(c.counts.items())}, written[0])
    if size is not None:
        d2t, t2d = mapping(speculators_ids(c, size), vocab)
        for name, arr in (
            (f"d2t-{size}.npy", np.array(d2t, dtype=np.int64)),
            (f"t2d-{size}.npy", np.array(t2d, dtype=np.bool_)),
        ):
            with atomic_path(folder / name) as tmp, tmp.open("wb") as f:
                np.save(f, arr)
            written.append(folder / name)
    return written


def write_specforge(folder: Path, c: TrainedCounts, vocab: int, size: int, torch: Any) -> Path:
    """``vocab_mapping.pt``: ``{"d2t": int64 [size], "t2d": bool [vocab]}``."""
    d2t, t2d = mapping(specforge_ids(c, size), vocab)
    path = folder / SPECFORGE_MAPPING
    _save(torch, {"d2t": torch.tensor(d2t), "t2d": torch.tensor(t2d)}, path)
    return path
