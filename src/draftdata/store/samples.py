"""``Ledger.samples``: what the tokens stage decided for each stored answer, a sample
(``samples``, with its provenance and mask) or a drop with its reason (``drops``, stage
``tokens``). The model stage writes a repaired sample back here too."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from ..records import Key, Sample
from . import codec
from .guard import guarded
from .part import KEY, Part


class Samples(Part):
    @guarded
    def put(self, key: Key, sample: Sample) -> None:
        """A sample replacing whatever the tokens stage decided for its key before."""
        self.put_rows([(key, codec.sample_row(sample))])

    @guarded
    def put_rows(self, rows: Sequence[tuple[Key, Sequence[Any]]]) -> None:
        """Samples already packed (``codec.sample_row``, in a worker), each replacing whatever
        the tokens stage decided for its key before."""
        self.db.executemany(
            "INSERT OR REPLACE INTO samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(*k.tuple(), *row) for k, row in rows],
        )
        self.db.executemany(
            f"DELETE FROM drops WHERE {KEY} AND stage='tokens'", [k.tuple() for k, _ in rows]
        )

    @guarded
    def forget(self, keys: Sequence[Key]) -> None:
        """What the tokens stage decided for ``keys`` (a sample or a drop), removed."""
        rows = [k.tuple() for k in keys]
        self.db.executemany(f"DELETE FROM samples WHERE {KEY}", rows)
        self.db.executemany(f"DELETE FROM drops WHERE {KEY} AND stage='tokens'", rows)

    @guarded
    def drop(self, key: Key, stage: str, reason: str) -> None:
        """A key dropped by ``stage`` with its reason; a tokens-stage drop replaces its sample."""
        self.db.execute(
            "INSERT OR REPLACE INTO drops VALUES (?,?,?,?,?,?)", (*key.tuple(), stage, reason)
        )
        if stage == "tokens":
            self.db.execute(f"DELETE FROM samples WHERE {KEY}", key.tuple())

    @guarded
    def decided(self, dataset: str) -> set[Key]:
        """Keys the tokens stage has decided: a sample or a drop."""
        rows = self.db.execute(
            "SELECT dataset, prompt_id, sample_idx, turn FROM samples WHERE dataset=? UNION "
            "SELECT dataset, prompt_id, sample_idx, turn FROM drops WHERE dataset=? AND "
            "stage='tokens'",
            (dataset, dataset),
        ).fetchall()
        return {Key(*r) for r in rows}

    @guarded
    def undecided(self, dataset: str) -> int:
        """Stored answers that have neither a sample nor a tokens-stage drop yet."""
        (n,) = self.db.execute(
            "SELECT count(*) FROM responses r WHERE r.dataset=? AND NOT EXISTS (SELECT 1 FROM "
            "samples s WHERE s.dataset=r.dataset AND s.prompt_id=r.prompt_id AND "
            "s.sample_idx=r.sample_idx AND s.turn=r.turn) AND NOT EXISTS (SELECT 1 FROM drops d "
            "WHERE d.dataset=r.dataset AND d.prompt_id=r.prompt_id AND d.sample_idx=r.sample_idx "
            "AND d.turn=r.turn AND d.stage='tokens')",
            (dataset,),
        ).fetchone()
        return int(n)

    def of(self, dataset: str) -> Iterator[Sample]:
        """A dataset's samples, streamed in key order."""
        for sample, _ in self.with_metadata(dataset, metadata=False):
            yield sample

    def with_metadata(
        self, dataset: str, metadata: bool = True
    ) -> Iterator[tuple[Sample, dict[str, Any]]]:
        """A dataset's samples streamed in key order, each with its prompt's metadata (joined
        here: an export holds one row at a time, not every prompt of the dataset)."""
        cols = f"s.dataset, s.prompt_id, s.sample_idx, s.turn, {_prefixed(codec.SAMPLE_COLUMNS)}"
        join = (
            ", p.metadata_json FROM samples s LEFT JOIN prompts p "
            "ON p.dataset = s.dataset AND p.prompt_id = s.prompt_id"
            if metadata
            else " FROM samples s"
        )
        sql = f"SELECT {cols}{join} WHERE s.dataset=? ORDER BY s.prompt_id, s.sample_idx, s.turn"
        n = 4 + len(codec.SAMPLE_COLUMNS.split(","))
        for r in self.db.execute(sql, (dataset,)):
            meta = json.loads(r[n]) if metadata and r[n] is not None else {}
            yield codec.sample_of(Key(*r[:4]), r[4:n]), meta

    @guarded
    def keys(self, dataset: str) -> list[Key]:
        """The keys of a dataset's samples, in the order ``of`` yields them."""
        rows = self.db.execute(
            "SELECT dataset, prompt_id, sample_idx, turn FROM samples WHERE dataset=? "
            "ORDER BY prompt_id, sample_idx, turn",
            (dataset,),
        ).fetchall()
        return [Key(*r) for r in rows]

    def of_keys(self, keys: Sequence[Key]) -> Iterator[Sample]:
        """The samples of ``keys`` (read one by one, so the caller may write between them)."""
        for key in keys:
            row = self.db.execute(
                f"SELECT {codec.SAMPLE_COLUMNS} FROM samples WHERE {KEY}", key.tuple()
            ).fetchone()
            if row is not None:
                yield codec.sample_of(key, row)


def _prefixed(columns: str) -> str:
    return ", ".join(f"s.{c.strip()}" for c in columns.split(","))
