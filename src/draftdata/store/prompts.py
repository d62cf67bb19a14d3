"""``Ledger.prompts``: the ``prompts`` table and the ``work`` keys made from it, (dataset,
prompt, sample, turn), with what is still to ask. The outcome of each key (answered, failed,
quarantined) is written by ``Ledger.answers``."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from ..records import ChainPage, PendingChain, Prompt
from . import codec
from .guard import guarded
from .part import Part

#: each prompt's first turn rendered to ids (one batched encode for many prompts); None where
#: it cannot be rendered (its request renders it again, and quarantines it with the reason)
Render = Callable[[list[Prompt]], list[list[int] | None]]
#: prompts read, rendered and written at a time: memory holds one chunk of a streamed dataset
CHUNK = 512
#: ... or at this many characters of their messages, whichever comes first: the first-turn ids
#: of 512 WritingBench prompts (14 KB each) held 67 MB of ints while they were rendered, and the
#: heap kept the room after (the 83k rehearsal's generation grew by 210 MB at that dataset)
CHUNK_CHARS = 1 << 21


def _chunks(prompts: Iterable[Prompt]) -> Iterator[list[Prompt]]:
    """``prompts`` in lists of at most CHUNK prompts and about CHUNK_CHARS characters."""
    chunk: list[Prompt] = []
    chars = 0
    for p in prompts:
        chunk.append(p)
        chars += sum(len(m.content or "") for m in p.messages)
        if len(chunk) >= CHUNK or chars >= CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


class Prompts(Part):
    def __init__(self, db: sqlite3.Connection, path: Path, readonly: bool) -> None:
        super().__init__(db, path, readonly)
        self._cache: dict[str, list[Prompt]] = {}

    @guarded
    def add(
        self,
        dataset: str,
        prompts: Iterable[Prompt],
        samples: int,
        turns: Callable[[Prompt], int],
        start: int = 0,
        render: Render | None = None,
    ) -> int:
        """Prompts (a stream is read a chunk at a time) from position ``start`` on, each with
        its work keys and its first turn's ids where ``render`` is given, in one transaction.
        Returns how many were given."""
        self._cache.pop(dataset, None)
        with self.tx():
            return self._insert(dataset, prompts, start, samples, turns, render)

    def _insert(
        self,
        dataset: str,
        prompts: Iterable[Prompt],
        start: int,
        samples: int,
        turns: Callable[[Prompt], int],
        render: Render | None = None,
    ) -> int:
        """Prompts from position ``start`` on, each with its work keys (inside a transaction)."""
        n = 0
        for chunk in _chunks(prompts):
            first = render(chunk) if render is not None else [None] * len(chunk)
            self.db.executemany(
                "INSERT OR IGNORE INTO prompts (dataset, prompt_id, idx, messages_json, "
                "tools_json, metadata_json, first_ids) VALUES (?,?,?,?,?,?,?)",
                [
                    (dataset, p.id, start + n + i, *codec.prompt_row(p), codec.pack_ids(ids))
                    for i, (p, ids) in enumerate(zip(chunk, first, strict=True))
                ],
            )
            self.db.executemany(
                "INSERT OR IGNORE INTO work (dataset, prompt_id, sample_idx, turn) "
                "VALUES (?,?,?,?)",
                [
                    (dataset, p.id, s, t)
                    for p in chunk
                    for s in range(samples)
                    for t in range(turns(p))
                ],
            )
            n += len(chunk)
        return n

    @guarded
    def replace_unanswered(
        self,
        dataset: str,
        prompts: list[Prompt],
        samples: int,
        turns: Callable[[Prompt], int],
        render: Render | None = None,
    ) -> tuple[int, int, int]:
        """A dataset read again from a changed source: prompts with an answer stay as they are;
        those without one that the source no longer has are removed with their work; new ones
        are added after the others. Returns (answered kept, removed, added)."""
        answered = {
            r[0]
            for r in self.db.execute(
                "SELECT DISTINCT prompt_id FROM responses WHERE dataset=?", (dataset,)
            )
        }
        existing = {
            r[0]
            for r in self.db.execute("SELECT prompt_id FROM prompts WHERE dataset=?", (dataset,))
        }
        new_ids = {p.id for p in prompts}
        self._cache.pop(dataset, None)
        gone = sorted(existing - answered - new_ids)
        fresh = [p for p in prompts if p.id not in existing]
        (top,) = self.db.execute(
            "SELECT coalesce(max(idx), -1) FROM prompts WHERE dataset=?", (dataset,)
        ).fetchone()
        with self.tx():
            for pid in gone:
                for table in ("prompts", "work", "drops"):
                    self.db.execute(
                        f"DELETE FROM {table} WHERE dataset=? AND prompt_id=?", (dataset, pid)
                    )
            self._insert(dataset, fresh, top + 1, samples, turns, render)
        return len(existing & answered), len(gone), len(fresh)

    @guarded
    def of(self, dataset: str) -> list[Prompt]:
        """A dataset's prompts in order. A writer reads them once and keeps them (it holds the
        run's lock: nobody else adds prompts); a reader reads them each time."""
        cached = self._cache.get(dataset)
        if cached is not None:
            return list(cached)
        rows = self.db.execute(
            "SELECT prompt_id, messages_json, tools_json, metadata_json FROM "
            "prompts WHERE dataset=? ORDER BY idx",
            (dataset,),
        ).fetchall()
        out = [codec.prompt_of(r[0], dataset, r[1], r[2], r[3]) for r in rows]
        if not self.readonly:
            self._cache[dataset] = out
        return list(out)

    @guarded
    def ids(self, exclude: str | None = None) -> set[str]:
        """The prompt ids of every dataset but ``exclude``."""
        rows = self.db.execute(
            "SELECT prompt_id FROM prompts WHERE dataset != ?", (exclude or "",)
        ).fetchall()
        return {r[0] for r in rows}

    @guarded
    def ids_of(self, dataset: str) -> set[str]:
        rows = self.db.execute("SELECT prompt_id FROM prompts WHERE dataset=?", (dataset,))
        return {r[0] for r in rows}

    @guarded
    def count(self, dataset: str) -> int:
        (n,) = self.db.execute(
            "SELECT count(*) FROM prompts WHERE dataset=?", (dataset,)
        ).fetchone()
        return int(n)

    @guarded
    def work_counts(self, dataset: str) -> tuple[int, int]:
        """(every work key, those still to ask) of a dataset."""
        total, todo = self.db.execute(
            "SELECT count(*), coalesce(sum(state NOT IN ('done', 'quarantined')), 0) FROM work "
            "WHERE dataset=?",
            (dataset,),
        ).fetchone()
        return int(total), int(todo)

    @guarded
    def pending_chains(self, dataset: str, after: int, limit: int) -> ChainPage:
        """The conversations (prompt, sample) with a turn still to ask among the ``limit``
        prompts after position ``after``, in order, each with how many of its turns are
        answered, and its first turn's ids where they were rendered when it was stored; and
        the position to ask from next (None past the last prompt). A run pages through its
        dataset this way: memory holds one page, not the dataset."""
        rows = self.db.execute(
            "SELECT p.idx, p.prompt_id, p.messages_json, p.tools_json, p.metadata_json, "
            "w.sample_idx, sum(w.state NOT IN ('done', 'quarantined')), sum(w.state = 'done'), "
            "p.first_ids "
            "FROM (SELECT * FROM prompts WHERE dataset=? AND idx > ? ORDER BY idx LIMIT ?) p "
            "JOIN work w ON w.dataset = p.dataset AND w.prompt_id = p.prompt_id "
            "GROUP BY p.idx, w.sample_idx ORDER BY p.idx, w.sample_idx",
            (dataset, after, limit),
        ).fetchall()
        out: list[PendingChain] = []
        last: Prompt | None = None
        first: Sequence[int] | None = None
        for r in rows:
            if r[6]:
                if last is None or last.id != r[1]:
                    last = codec.prompt_of(r[1], dataset, r[2], r[3], r[4])
                    first = codec.ids_array(r[8])
                out.append(PendingChain(last, r[5], r[7], first))
        return ChainPage(tuple(out), rows[-1][0] if rows else None)
