"""Segments: the unit every format renders to, and the one pass that turns them into ids + mask."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..tokenizers import Tokenizer


@dataclass(frozen=True)
class Text:
    """Ordinary text: always encoded as text, never matched against control tokens."""

    text: str
    trained: bool = False


@dataclass(frozen=True)
class Special:
    """A control token, named by the format's marker name and resolved to a verified id."""

    marker: str
    trained: bool = False


Segment = Text | Special


def train(segments: Iterable[Segment], trained: bool = True) -> list[Segment]:
    return [
        Text(s.text, trained) if isinstance(s, Text) else Special(s.marker, trained)
        for s in segments
    ]


def merge_text(segments: Iterable[Segment]) -> list[Segment]:
    """Join adjacent text with the same ``trained`` flag (BPE merges across them); drop empties."""
    out: list[Segment] = []
    for s in segments:
        if isinstance(s, Text):
            if not s.text:
                continue
            last = out[-1] if out else None
            if isinstance(last, Text) and last.trained == s.trained:
                out[-1] = Text(last.text + s.text, s.trained)
                continue
        out.append(s)
    return out


def encode_segments(
    segments: Sequence[Segment],
    tokenizer: Tokenizer,
    marker_ids: dict[str, int],
    text_ids: Callable[[str, list[int]], list[int]] | None = None,
) -> tuple[list[int], list[bool]]:
    """Build ``input_ids`` and ``loss_mask`` in one pass (torchtune-style). ``text_ids`` may
    rewrite the canonical ids of each text piece (learned split preferences); it must keep the
    bytes the same."""
    merged = merge_text(segments)
    texts = [s.text for s in merged if isinstance(s, Text)]
    batch = tokenizer.encode_batch(texts) if texts else []
    if text_ids is not None:
        batch = [text_ids(t, ids) for t, ids in zip(texts, batch, strict=True)]
    encoded = iter(batch)
    ids: list[int] = []
    mask: list[bool] = []
    for s in merged:
        if isinstance(s, Text):
            piece = next(encoded)
            ids.extend(piece)
            mask.extend([s.trained] * len(piece))
        else:
            ids.append(marker_ids[s.marker])
            mask.append(s.trained)
    return ids, mask


def segments_text(segments: Iterable[Segment], marker_texts: dict[str, str]) -> str:
    """The string a chat template would print for these segments (for diffs and debugging)."""
    return "".join(s.text if isinstance(s, Text) else marker_texts[s.marker] for s in segments)
