"""Segments: the unit every format renders to, and the one pass that turns them into ids + mask."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import DraftdataError
from ..tokenizers import Tokenizer

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Ids = npt.NDArray[np.int32]


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


#: learned split preferences: a text piece and its canonical ids -> the ids to use (same bytes)
TextIds = Callable[[str, list[int]], list[int]]
#: merged segments as piece numbers (text, in a ``PieceEncoder``) and marker names (control ids)
Layout = list[int | str]

#: what a truncated answer's text is assumed to continue with: a ``length`` cut ends mid-stream, and
#: the canonical encoder must not treat the cut as the end of the text (a whitespace run at the end
#: of a string merges differently than one followed by more text)
OPEN_END_PROBE = "a"


class PieceEncoder:
    """The one path from segments to ids: ``encode_segments`` (one sequence), reconstruction (a
    window of records) and the repair of an answer (the rest of a run) all lay their segments out
    here, encode, and assemble here.

    Text pieces are encoded in one batched ``Tokenizer.encode_batch`` call per ``run``: each
    distinct piece once (a template's constant pieces recur in every record); a truncated
    answer's last piece once, open-ended (``text + probe``, the probe cut off, the plain encoding
    where the probe merged into the last token). A piece the tokenizer cannot keep as text
    fails only where it is used (``ids`` raises its error).

    ``arrays``: keep the ids as int32 arrays where the tokenizer gives them so
    (``encode_batch_arrays``), for ``assemble_array``: no Python int per token."""

    def __init__(self, tok: Tokenizer, arrays: bool = False) -> None:
        self.tok = tok
        self.arrays = arrays
        self._index: dict[tuple[str, bool], int] = {}
        self._todo: list[tuple[str, bool]] = []
        self._ids: list[list[int] | Ids | DraftdataError] = []
        self._markers: dict[str, Ids] = {}

    def add(self, text: str, open_end: bool = False) -> int:
        key = (text, open_end)
        j = self._index.get(key)
        if j is None:
            j = self._index[key] = len(self._todo)
            self._todo.append(key)
        return j

    def layout(
        self, segments: Sequence[Segment], open_end_last: bool = False
    ) -> tuple[Layout, list[bool]]:
        """``merge_text(segments)`` as piece numbers and marker names, and each one's trained
        flag; ``open_end_last``: a last text piece is encoded open-ended."""
        merged = merge_text(segments)
        last = len(merged) - 1 if open_end_last and merged and isinstance(merged[-1], Text) else -1
        layout: Layout = [
            self.add(s.text, i == last) if isinstance(s, Text) else s.marker
            for i, s in enumerate(merged)
        ]
        return layout, [s.trained for s in merged]

    def run(self) -> None:
        """Encode every piece added since the last run: one batched call, and a second for the
        open-ended pieces whose probe merged into their last token (those take the plain
        encoding)."""
        todo = self._todo[len(self._ids) :]
        got = self._encode([t + OPEN_END_PROBE if o else t for t, o in todo])
        merged: list[int] = []
        for i, ((_, open_end), ids) in enumerate(zip(todo, got, strict=True)):
            if open_end and not isinstance(ids, DraftdataError):
                cut = _without_probe(self.tok, ids if isinstance(ids, list) else ids.tolist())
                if cut is None:
                    merged.append(i)
                else:
                    got[i] = cut
        for i, ids in zip(merged, self._encode([todo[i][0] for i in merged]), strict=True):
            got[i] = ids
        self._ids += got

    def _encode(self, texts: list[str]) -> list[list[int] | Ids | DraftdataError]:
        if not texts:
            return []
        if self.arrays and (got := self.tok.encode_batch_arrays(texts)) is not None:
            return list(got)
        try:
            return list(self.tok.encode_batch(texts))
        except DraftdataError:  # one piece the tokenizer cannot keep as text: find it
            out: list[list[int] | Ids | DraftdataError] = []
            for t in texts:
                try:
                    out.append(self.tok.encode(t))
                except DraftdataError as e:
                    out.append(e)
            return out

    def text(self, j: int) -> str:
        return self._todo[j][0]

    def ids(self, j: int) -> list[int]:
        got = self._ids[j]
        if isinstance(got, DraftdataError):
            raise got
        return got if isinstance(got, list) else got.tolist()

    def assemble(
        self,
        layout: Sequence[int | str],
        marker_ids: dict[str, int],
        trained: bool | Sequence[bool],
        text_ids: TextIds | None = None,
    ) -> tuple[list[int], list[bool]]:
        """``input_ids`` and ``loss_mask`` of a layout whose pieces have been ``run``:
        ``trained`` is one flag for all of it or one per piece; ``text_ids`` (learned split
        preferences) rewrites the canonical ids of each trained text piece."""
        ids: list[int] = []
        if isinstance(trained, bool):
            rewrite = text_ids if trained else None
            for p in layout:
                if isinstance(p, str):
                    ids.append(marker_ids[p])
                elif rewrite is None:
                    ids += self.ids(p)
                else:
                    ids += rewrite(self.text(p), self.ids(p))
            return ids, [trained] * len(ids)
        mask: list[bool] = []
        for p, flag in zip(layout, trained, strict=True):
            if isinstance(p, str):
                piece = [marker_ids[p]]
            else:
                piece = self.ids(p)
                if flag and text_ids is not None:
                    piece = text_ids(self.text(p), piece)
            ids += piece
            mask += [flag] * len(piece)
        return ids, mask

    def assemble_array(
        self,
        layout: Sequence[int | str],
        marker_ids: dict[str, int],
        trained: bool | Sequence[bool],
        text_ids: TextIds | None = None,
    ) -> tuple[Ids, npt.NDArray[np.bool_]]:
        """``assemble`` as an int32 array of ids and a bool array of the mask, built from the
        pieces' arrays where ``run`` kept them so."""
        import numpy as np

        flags = [trained] * len(layout) if isinstance(trained, bool) else trained
        parts: list[Ids] = []
        for p, flag in zip(layout, flags, strict=True):
            if isinstance(p, str):
                piece = self._markers.get(p)
                if piece is None:
                    piece = self._markers[p] = np.array([marker_ids[p]], dtype=np.int32)
            elif flag and text_ids is not None:
                piece = np.array(text_ids(self.text(p), self.ids(p)), dtype=np.int32)
            else:
                got = self._ids[p]
                if isinstance(got, DraftdataError):
                    raise got
                piece = np.array(got, dtype=np.int32) if isinstance(got, list) else got
            parts.append(piece)
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        if isinstance(trained, bool):
            return ids, np.full(len(ids), trained)
        return ids, np.repeat(np.array(flags, dtype=bool), [len(x) for x in parts])


def _without_probe(
    tok: Tokenizer, ids: Sequence[int], probe: str = OPEN_END_PROBE
) -> list[int] | None:
    extra = len(probe.encode())  # walk back from the end over the probe's bytes only
    k = len(ids)
    while extra > 0 and k > 0:
        k -= 1
        extra -= len(tok.token_bytes(ids[k]))
    return list(ids[:k]) if extra == 0 else None


def encode_segments(
    segments: Sequence[Segment],
    tokenizer: Tokenizer,
    marker_ids: dict[str, int],
    text_ids: TextIds | None = None,
) -> tuple[list[int], list[bool]]:
    """Build ``input_ids`` and ``loss_mask`` of one sequence (torchtune-style), through
    ``PieceEncoder``. ``text_ids`` may rewrite the canonical ids of each trained text piece
    (learned split preferences); it must keep the bytes the same."""
    enc = PieceEncoder(tokenizer)
    layout, trained = enc.layout(segments)
    enc.run()
    return enc.assemble(layout, marker_ids, trained, text_ids)


def piece_ids(
    tok: Tokenizer, text: str, open_end: bool = False, text_ids: TextIds | None = None
) -> list[int]:
    """The ids of one trained text piece (open-ended: the prefix of ``text + probe``, as a
    truncated answer's last piece), through ``PieceEncoder``."""
    enc = PieceEncoder(tok)
    layout = [enc.add(text, open_end)]
    enc.run()
    return enc.assemble(layout, {}, True, text_ids)[0]


def open_ended_ids(tok: Tokenizer, text: str) -> list[int]:
    """Encode ``text`` as the prefix of ``text + probe``: the ids whose bytes end exactly where
    the text ends. The plain encoding where the probe merges into the last token."""
    return piece_ids(tok, text, open_end=True)


def segments_text(segments: Iterable[Segment], marker_texts: dict[str, str]) -> str:
    """The string a chat template would print for these segments (for diffs and debugging)."""
    return "".join(s.text if isinstance(s, Text) else marker_texts[s.marker] for s in segments)
