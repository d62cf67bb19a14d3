"""Segments to ids: the one encoder, made only by a :class:`~draftdata.tokens.target.Target`
(``Target.encoder``), so the target's markers and split preferences travel with it.

Text pieces are encoded in one batched ``Tokenizer.encode_batch`` call per ``run``: each distinct
piece once (a template's constant pieces recur in every record); a truncated answer's last piece
once, open-ended (``text + probe``, the probe cut off, the plain encoding where the probe merged
into the last token). A piece the tokenizer cannot keep as text fails only where it is used
(``ids`` raises its error)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import DraftdataError, MarkerError
from ..formats.segments import Segment, Special, Text, TextIds, merge_text
from ..tokenizers import Tokenizer

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Ids = npt.NDArray[np.int32]

#: merged segments as piece numbers (text, in a ``PieceEncoder``) and marker names (control ids)
Layout = list[int | str]

#: what a truncated answer's text is assumed to continue with: a ``length`` cut ends mid-stream, and
#: the canonical encoder must not treat the cut as the end of the text (a whitespace run at the end
#: of a string merges differently than one followed by more text)
OPEN_END_PROBE = "a"


class PieceEncoder:
    """Lay segments out (``layout``), encode every piece at once (``run``), assemble each
    sequence (``assemble``): as lists, or, with ``arrays``, as int32 arrays kept from the
    tokenizer on (``encode_batch_arrays``: no Python int per token). Split preferences
    (``prefs``) rewrite the canonical ids of each trained text piece, the same bytes."""

    def __init__(
        self,
        tok: Tokenizer,
        marker_ids: dict[str, int],
        prefs: TextIds | None,
        format_name: str,
        arrays: bool = False,
    ) -> None:
        self.tok = tok
        self.marker_ids = marker_ids
        self.prefs = prefs
        self.format_name = format_name
        self.arrays = arrays
        self._index: dict[tuple[str, bool], int] = {}
        self._todo: list[tuple[str, bool]] = []
        self._ids: list[list[int] | Ids | DraftdataError] = []
        self._markers: dict[str, Any] = {}

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
        flag; ``open_end_last``: a last text piece is encoded open-ended. A marker this
        tokenizer does not have as a control token is a MarkerError that names it."""
        missing = {s.marker for s in segments if isinstance(s, Special)} - set(self.marker_ids)
        if missing:
            raise MarkerError(
                f"format {self.format_name} needs marker(s) {sorted(missing)} that this "
                "tokenizer does not have as control tokens"
            )
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

    def _piece(self, p: int | str, trained: bool) -> Any:
        """One laid-out piece's ids: a marker's verified id, a text's canonical ids, rewritten
        by the preferences where it is trained; as this encoder keeps ids (list or array)."""
        if isinstance(p, str):
            got = self._markers.get(p)
            if got is None:
                got = self._markers[p] = self.sequence([self.marker_ids[p]])
            return got
        ids = self._ids[p]
        if isinstance(ids, DraftdataError):
            raise ids
        if trained and self.prefs is not None:
            ids = self.prefs(self._todo[p][0], ids if isinstance(ids, list) else ids.tolist())
        if isinstance(ids, list) and not self.arrays:
            return ids  # the common case, without a call
        return self.sequence(ids)

    def sequence(self, ids: Any) -> Any:
        """``ids`` as this encoder keeps them: a list, or an int32 array."""
        if not self.arrays:
            return ids if isinstance(ids, list) else list(ids)
        import numpy as np

        return ids if isinstance(ids, np.ndarray) else np.array(ids, dtype=np.int32)

    def assemble(self, layout: Sequence[int | str], trained: bool | Sequence[bool]) -> Any:
        """``(input_ids, loss_mask)`` of a layout whose pieces have been ``run``: ``trained`` is
        one flag for all of it or one per piece. Lists, or int32 and bool arrays."""
        flags = [trained] * len(layout) if isinstance(trained, bool) else list(trained)
        parts = [self._piece(p, f) for p, f in zip(layout, flags, strict=True)]
        return self._joined(parts, flags)

    def join(self, prompt: Any, response: Any) -> Any:
        """``(input_ids, loss_mask)`` of a prompt (not trained) followed by its answer."""
        return self._joined([self.sequence(prompt), self.sequence(response)], [False, True])

    def _joined(self, parts: list[Any], flags: list[bool]) -> Any:
        if not self.arrays:
            ids: list[int] = []
            mask: list[bool] = []
            for part, flag in zip(parts, flags, strict=True):
                ids += part
                mask += [flag] * len(part)
            return ids, mask
        import numpy as np

        if not parts:
            return np.zeros(0, np.int32), np.zeros(0, bool)
        lengths = [len(x) for x in parts]
        return np.concatenate(parts), np.repeat(np.array(flags, dtype=bool), lengths)

    @staticmethod
    def first_trained(mask: Any) -> int:
        """The index of the first trained id (the prompt's length); the length where none is."""
        if isinstance(mask, list):
            return mask.index(True) if True in mask else len(mask)
        import numpy as np

        trained = np.flatnonzero(mask)
        return int(trained[0]) if len(trained) else len(mask)


def _without_probe(
    tok: Tokenizer, ids: Sequence[int], probe: str = OPEN_END_PROBE
) -> list[int] | None:
    extra = len(probe.encode())  # walk back from the end over the probe's bytes only
    k = len(ids)
    while extra > 0 and k > 0:
        k -= 1
        extra -= len(tok.token_bytes(ids[k]))
    return list(ids[:k]) if extra == 0 else None
