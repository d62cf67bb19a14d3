"""The ledger's ``scores`` table: what the model stage measured for each sample, and the repairs
it made. A mixin of :class:`~draftdata.store.ledger.Ledger` (same connection, same rules)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence

from ..records import Key, Repair, Sample, SampleScore, StoredScore
from . import codec


class ScoresMixin:
    db: sqlite3.Connection

    # --- scores (the model stage) ----------------------------------------------------------
    def put_score(
        self,
        key: Key,
        model: str,
        threshold: float,
        score: SampleScore,
        repairs: Sequence[Repair],
    ) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO scores VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (*key.tuple(), *codec.score_row(model, threshold, score, repairs), time.time()),
        )

    def scored(self, dataset: str, model: str) -> set[Key]:
        """Keys whose current sample was scored with ``model`` (a repaired sample keeps its
        score; a sample made again later is scored again)."""
        if not self._has_table("scores"):
            return set()
        rows = self.db.execute(
            "SELECT c.dataset, c.prompt_id, c.sample_idx, c.turn FROM scores c JOIN samples s "
            "ON s.dataset=c.dataset AND s.prompt_id=c.prompt_id AND s.sample_idx=c.sample_idx "
            "AND s.turn=c.turn AND s.token_source=c.token_source WHERE c.dataset=? AND c.model=?",
            (dataset, model),
        ).fetchall()
        return {Key(*r) for r in rows}

    def scores(self) -> Iterator[StoredScore]:
        """Every stored score, with the model and threshold that made it and its repairs."""
        if not self._has_table("scores"):
            return
        for r in self.db.execute(
            "SELECT * FROM scores ORDER BY dataset, prompt_id, sample_idx, turn"
        ).fetchall():
            yield codec.score_of(Key(*r[:4]), r[4:12])

    def sample_keys(self, dataset: str) -> list[Key]:
        """The keys of a dataset's samples, in the order ``samples`` yields them."""
        rows = self.db.execute(
            "SELECT dataset, prompt_id, sample_idx, turn FROM samples WHERE dataset=? "
            "ORDER BY prompt_id, sample_idx, turn",
            (dataset,),
        ).fetchall()
        return [Key(*r) for r in rows]

    def samples_for(self, keys: Sequence[Key]) -> Iterator[Sample]:
        """The samples of ``keys`` (read one by one, so the caller may write between them)."""
        for key in keys:
            row = self.db.execute(
                f"SELECT {codec.SAMPLE_COLUMNS} FROM samples WHERE dataset=? AND prompt_id=? "
                "AND sample_idx=? AND turn=?",
                key.tuple(),
            ).fetchone()
            if row is not None:
                yield codec.sample_of(key, row)

    def _has_table(self, name: str) -> bool:
        return (
            self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)
            ).fetchone()
            is not None
        )
