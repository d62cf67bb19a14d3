"""Answer records (one JSON object per answer, the shape ``draftdata reconstruct`` reads) into
samples: each record parsed at the wire into a reconstruct ``Item``, reconstructed in order, and
every record that gives no sample counted with its reason. One process runs this over a whole
file; ``reconstruct --jobs`` runs it over each chunk of lines in a worker."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import DraftdataError, InputError, ReconstructError
from ..records import PackedSample, Sample
from ..records.wire import messages_of, raw_ids, view_from_record
from .reconstruct import Item, samples

if TYPE_CHECKING:
    from .encoding import TargetEncoding


def item_of(
    rec: Mapping[str, Any], index: int = 0, all_turns: bool = False, server: str = "auto"
) -> Item:
    """One answer record as a reconstruct item, or the ReconstructError (``no_response``,
    ``no_messages``) or InputError that says why it is not an answer. A ``server`` other than
    ``auto`` is taken to have parsed it (it was named on the command line)."""
    view = view_from_record(rec)
    if view is None:
        raise ReconstructError("record has neither api_view nor choices", "no_response")
    if not isinstance(rec.get("messages"), list):
        raise ReconstructError("record has no messages list", "no_messages")
    if server != "auto":
        view = replace(view, server=server)
    out_ids, prompt_ids = raw_ids(rec)
    return Item(
        messages_of(rec["messages"]),
        view,
        tools=rec.get("tools") or (),
        record_id=str(rec.get("id", index)),
        dataset=str(rec.get("source") or rec.get("dataset") or ""),
        all_turns=all_turns,
        output_ids=out_ids,
        server_prompt_ids=prompt_ids,
    )


def items_of(
    records: Iterable[Mapping[str, Any]],
    drops: dict[str, int],
    all_turns: bool = False,
    server: str = "auto",
) -> Iterator[Item]:
    """The answers of ``records`` as reconstruct items (``item_of``), in order; a record that
    is not an answer is counted in ``drops`` by its reason."""
    for i, rec in enumerate(records):
        try:
            yield item_of(rec, i, all_turns, server)
        except ReconstructError as e:
            drops[e.reason] = drops.get(e.reason, 0) + 1
        except InputError as e:
            drops[f"bad_record:{e}"] = drops.get(f"bad_record:{e}", 0) + 1


def samples_of(
    target: TargetEncoding,
    records: Iterable[Mapping[str, Any]],
    drops: dict[str, int],
    all_turns: bool,
    server: str = "auto",
    packed: bool = False,
) -> Iterator[Sample | PackedSample]:
    """The samples of ``records`` in order; each record that gives none is counted in
    ``drops`` by its reason. ``packed``: PackedSamples (for a Parquet file)."""
    items = items_of(records, drops, all_turns, server)
    made = samples(target, items, packed=packed)
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
