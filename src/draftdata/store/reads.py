"""The ledger's reads of prompts, work and stored answers, as a run pages through them. A mixin
of :class:`~draftdata.store.ledger.Ledger` (same connection, same rules)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from itertools import groupby
from typing import Any

from ..records import (
    AnsweredChain,
    ChainPage,
    Key,
    PendingChain,
    Prompt,
    Sample,
    StoredResponse,
)
from . import codec

#: a stored answer's columns (``_stored`` reads them in this order) and where they come from
_COLUMNS = (
    "r.dataset, r.prompt_id, r.sample_idx, r.turn, r.backend, r.response_json, a.response, "
    "r.output_ids, r.prompt_ids, r.finish_reason, r.cost_usd, r.our_prompt_ids, r.problem"
)
_FROM = "FROM responses r LEFT JOIN attempts a ON a.id = r.attempt_id"


class ReadsMixin:
    db: sqlite3.Connection

    def count_prompts(self, dataset: str) -> int:
        (n,) = self.db.execute(
            "SELECT count(*) FROM prompts WHERE dataset=?", (dataset,)
        ).fetchone()
        return int(n)

    def count_responses(self, dataset: str) -> int:
        (n,) = self.db.execute(
            "SELECT count(*) FROM responses WHERE dataset=?", (dataset,)
        ).fetchone()
        return int(n)

    def prompt_ids_of(self, dataset: str) -> set[str]:
        rows = self.db.execute("SELECT prompt_id FROM prompts WHERE dataset=?", (dataset,))
        return {r[0] for r in rows}

    def work_counts(self, dataset: str) -> tuple[int, int]:
        """(every work key, those still to ask) of a dataset."""
        total, todo = self.db.execute(
            "SELECT count(*), coalesce(sum(state NOT IN ('done', 'quarantined')), 0) FROM work "
            "WHERE dataset=?",
            (dataset,),
        ).fetchone()
        return int(total), int(todo)

    def pending_chains(self, dataset: str, after: int, limit: int) -> ChainPage:
        """The conversations (prompt, sample) with a turn still to ask among the ``limit``
        prompts after position ``after``, in order, each with how many of its turns are
        answered; and the position to ask from next (None past the last prompt). A run pages
        through its dataset this way: memory holds one page, not the dataset."""
        rows = self.db.execute(
            "SELECT p.idx, p.prompt_id, p.messages_json, p.tools_json, p.metadata_json, "
            "w.sample_idx, sum(w.state NOT IN ('done', 'quarantined')), sum(w.state = 'done') "
            "FROM (SELECT * FROM prompts WHERE dataset=? AND idx > ? ORDER BY idx LIMIT ?) p "
            "JOIN work w ON w.dataset = p.dataset AND w.prompt_id = p.prompt_id "
            "GROUP BY p.idx, w.sample_idx ORDER BY p.idx, w.sample_idx",
            (dataset, after, limit),
        ).fetchall()
        out: list[PendingChain] = []
        last: Prompt | None = None
        for r in rows:
            if r[6]:
                if last is None or last.id != r[1]:
                    last = codec.prompt_of(r[1], dataset, r[2], r[3], r[4])
                out.append(PendingChain(last, r[5], r[7]))
        return ChainPage(tuple(out), rows[-1][0] if rows else None)

    def chain_responses(
        self, dataset: str, prompt_id: str, sample: int
    ) -> dict[int, StoredResponse]:
        """The stored answers of one conversation, by turn."""
        rows = self.db.execute(
            self._RESPONSE + " AND r.prompt_id=? AND r.sample_idx=?", (dataset, prompt_id, sample)
        ).fetchall()
        return {s.key.turn: s for s in map(_stored, rows)}

    def iter_chains(self, dataset: str) -> Iterator[AnsweredChain]:
        """Every answered conversation of a dataset with its prompt and stored answers (turn
        order), one at a time (a cursor in the responses' key order: memory holds one
        conversation)."""
        cur = self.db.execute(
            f"SELECT {_COLUMNS}, p.messages_json, p.tools_json, p.metadata_json {_FROM} "
            "JOIN prompts p ON p.dataset = r.dataset AND p.prompt_id = r.prompt_id "
            "WHERE r.dataset=? ORDER BY r.prompt_id, r.sample_idx, r.turn",
            (dataset,),
        )
        rows = (r for batch in iter(lambda: cur.fetchmany(256), []) for r in batch)
        for (pid, s), group in groupby(rows, key=lambda r: (r[1], r[2])):
            chain = list(group)
            head = chain[0]
            yield AnsweredChain(
                codec.prompt_of(pid, dataset, head[13], head[14], head[15]),
                s,
                tuple(_stored(r) for r in chain),
            )

    _RESPONSE = f"SELECT {_COLUMNS} {_FROM} WHERE r.dataset=?"

    def responses(self, dataset: str) -> dict[Key, StoredResponse]:
        """Every stored answer of a dataset. A response body is kept once, in its attempt;
        ``response_json`` holds only what was not a body (an engine's own record)."""
        rows = self.db.execute(self._RESPONSE, (dataset,)).fetchall()
        return {s.key: s for s in map(_stored, rows)}

    def samples(self, dataset: str) -> Iterator[Sample]:
        """A dataset's samples, streamed in key order."""
        for sample, _ in self.samples_with_metadata(dataset, metadata=False):
            yield sample

    def samples_with_metadata(
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


def _prefixed(columns: str) -> str:
    return ", ".join(f"s.{c.strip()}" for c in columns.split(","))


def _stored(r: Sequence[Any]) -> StoredResponse:
    problem = r[12]
    response: dict[str, Any] = {}
    if problem is None:  # a quarantined answer's body is kept, never parsed again
        body = r[5] if r[5] is not None else codec.unpack_text(r[6])
        try:
            got = json.loads(body) if body else {}
        except (ValueError, RecursionError) as e:  # stored by a draftdata that read it less
            got, problem = {}, f"unusable_message: the stored body does not parse ({e})"[:200]
        if isinstance(got, dict):
            response = got
    return StoredResponse(
        Key(*r[:4]),
        r[4],
        response,
        codec.unpack_ids(r[7]),
        codec.unpack_ids(r[8]),
        r[9],
        r[10],
        codec.unpack_ids(r[11]),
        problem,
    )
