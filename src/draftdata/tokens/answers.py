"""Answer records (one JSON object per answer, the shape ``draftdata reconstruct`` reads) into
samples: each record parsed at the wire into a reconstruct ``Item``, reconstructed in order, and
every record that gives no sample counted with its reason. One process runs this over a whole
file; ``reconstruct --jobs`` runs it over each chunk of lines in a worker."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from ..errors import DraftdataError, InputError, ReconstructError
from ..formats import BoundFormat
from ..records import PackedSample, Sample
from ..records.wire import messages_of, raw_ids, view_from_record
from .reconstruct import Item, TextIds, reconstruct_many


def items_of(
    records: Iterable[Mapping[str, Any]],
    drops: dict[str, int],
    all_turns: bool = False,
    server: str = "auto",
) -> Iterator[Item]:
    """The answers of ``records`` as reconstruct items, in order; a record that is not an
    answer is counted in ``drops`` by its reason. A ``server`` other than ``auto`` is taken to
    have parsed every answer (it was named on the command line)."""
    for i, rec in enumerate(records):
        try:
            view = view_from_record(rec)
            if view is None:
                raise ReconstructError("record has neither api_view nor choices", "no_response")
            if not isinstance(rec.get("messages"), list):
                raise ReconstructError("record has no messages list", "no_messages")
            if server != "auto":
                view = replace(view, server=server)
            out_ids, prompt_ids = raw_ids(rec)
            yield Item(
                messages_of(rec["messages"]),
                view,
                tools=rec.get("tools") or (),
                record_id=str(rec.get("id", i)),
                dataset=str(rec.get("source") or rec.get("dataset") or ""),
                all_turns=all_turns,
                output_ids=out_ids,
                server_prompt_ids=prompt_ids,
            )
        except ReconstructError as e:
            drops[e.reason] = drops.get(e.reason, 0) + 1
        except InputError as e:
            drops[f"bad_record:{e}"] = drops.get(f"bad_record:{e}", 0) + 1


def samples_of(
    bound: BoundFormat,
    records: Iterable[Mapping[str, Any]],
    drops: dict[str, int],
    all_turns: bool,
    thinking: bool | None,
    text_ids: TextIds | None,
    server: str = "auto",
    packed: bool = False,
) -> Iterator[Sample | PackedSample]:
    """The samples of ``records`` in order; each record that gives none is counted in
    ``drops`` by its reason. ``packed``: PackedSamples (for a Parquet file)."""
    items = items_of(records, drops, all_turns, server)
    made: Iterator[Sample | PackedSample | DraftdataError] = (
        reconstruct_many(bound, items, thinking=thinking, text_ids=text_ids, packed=True)
        if packed
        else reconstruct_many(bound, items, thinking=thinking, text_ids=text_ids)
    )
    for s in made:
        if isinstance(s, DraftdataError):
            reason = getattr(s, "reason", None) or f"bad_record:{s}"
            drops[reason] = drops.get(reason, 0) + 1
        else:
            yield s


def count_sample(s: Sample | PackedSample, counts: dict[str, int]) -> None:
    """A written sample counted by token source, and by what its server's view lost."""
    counts[s.token_source] = counts.get(s.token_source, 0) + 1
    for w in s.warnings:
        if w.startswith("lossy:"):
            counts[w] = counts.get(w, 0) + 1
