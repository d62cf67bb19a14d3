"""``Ledger.scores``: the ``scores`` table, what the model stage measured for each sample and the
repairs it made (a repaired sample itself is written back through ``Ledger.samples``)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from ..records import Key, Repair, SampleScore, StoredScore
from . import codec
from .guard import guarded
from .part import Part, has_table


class Scores(Part):
    @guarded
    def put(
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

    @guarded
    def scored(self, dataset: str, model: str) -> set[Key]:
        """Keys whose current sample was scored with ``model`` (a repaired sample keeps its
        score; a sample made again later is scored again)."""
        if not has_table(self.db, "scores"):
            return set()
        rows = self.db.execute(
            "SELECT c.dataset, c.prompt_id, c.sample_idx, c.turn FROM scores c JOIN samples s "
            "ON s.dataset=c.dataset AND s.prompt_id=c.prompt_id AND s.sample_idx=c.sample_idx "
            "AND s.turn=c.turn AND s.token_source=c.token_source WHERE c.dataset=? AND c.model=?",
            (dataset, model),
        ).fetchall()
        return {Key(*r) for r in rows}

    def all(self) -> Iterator[StoredScore]:
        """Every stored score, with the model and threshold that made it and its repairs."""
        if not has_table(self.db, "scores"):
            return
        for r in self.db.execute(
            "SELECT * FROM scores ORDER BY dataset, prompt_id, sample_idx, turn"
        ).fetchall():
            yield codec.score_of(Key(*r[:4]), r[4:12])
