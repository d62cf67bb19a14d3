"""The ledger's ``meta`` table: what one stage of a run leaves for another besides its answers
and samples. Every record it holds is declared here once, with its key (a dataset's records
take the dataset's name) and its one serialiser each way; ``Ledger.meta`` reads and writes
them, and nothing else names a key.

A value is the JSON ``json.dumps`` writes of it, as it was before the records were typed, so the
ledger of an older draftdata reads the same. A value that is not the record it should be (a
hand-edited ledger) is a LedgerError naming the key, never a record taken half."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar, cast, overload

from ..records import Counting
from ..records.meta import Contamination, DatasetSettings, FlaggedPrompt, GateRecord
from .guard import LedgerError, guarded
from .part import Part, has_table

T = TypeVar("T")
D = TypeVar("D")


@dataclass(frozen=True)
class MetaKey(Generic[T]):
    """One row of ``meta``: its key, and its record to JSON (``dump``) and back (``load``, which
    raises ValueError or TypeError on a value that is not one)."""

    key: str
    dump: Callable[[T], Any]
    load: Callable[[Any], T]


@dataclass(frozen=True)
class PerDataset(Generic[T]):
    """A record kept once per dataset, under ``<prefix>:<dataset>``."""

    prefix: str
    dump: Callable[[T], Any]
    load: Callable[[Any], T]

    def of(self, dataset: str) -> MetaKey[T]:
        return MetaKey(f"{self.prefix}:{dataset}", self.dump, self.load)


# --- the serialisers ----------------------------------------------------------------------------


def _as_is(value: T) -> T:
    return value


def _int(doc: Any) -> int:
    return int(doc)


def _str(doc: Any) -> str:
    if not isinstance(doc, str):
        raise TypeError("not a string")
    return doc


def _object(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise TypeError("not a JSON object")
    return doc


def _strings(doc: Any) -> list[str]:
    if not isinstance(doc, list):
        raise TypeError("not a list")
    return [str(a) for a in doc]


def _counts_json(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(counts)


def _counts(doc: Any) -> dict[str, int]:
    return {str(k): _count(v) for k, v in _object(doc).items()}


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{v!r} is not a count")
    return v


def _limit(doc: Any) -> int | None:
    return None if doc is None else _count(doc)


def _settings(doc: Any) -> DatasetSettings:
    return cast(DatasetSettings, _object(doc))


def _settings_json(s: DatasetSettings) -> dict[str, Any]:
    return dict(s)


def gate_json(g: GateRecord) -> dict[str, Any]:
    """The gate as the ledger keeps it: ``measure.gate.Gate.to_json``'s object, without the
    fields an older record lacks."""
    doc: dict[str, Any] = {
        "min_exact": g.min_exact,
        "exact_match_rate": g.exact_match_rate,
        "passed": g.passed,
        "forced": g.forced,
        "reason": g.reason,
    }
    for name, value in (("gated", g.gated), ("unmeasured", g.unmeasured), ("evidence", g.evidence)):
        if value is not None:
            doc[name] = value
    return doc


def gate_of(doc: Any) -> GateRecord:
    d = _object(doc)
    rate = d["exact_match_rate"]
    return GateRecord(
        float(d["min_exact"]),
        None if rate is None else float(rate),
        bool(d["passed"]),
        bool(d["forced"]),
        str(d["reason"]),
        None if d.get("gated") is None else bool(d["gated"]),
        None if d.get("unmeasured") is None else str(d["unmeasured"]),
        None if d.get("evidence") is None else str(d["evidence"]),
    )


def contamination_json(c: Contamination) -> dict[str, Any]:
    """A dataset's contamination tally as the ledger keeps it (and ``draftdata contamination
    --json`` prints it)."""
    return {
        "checked": c.checked,
        "flagged": c.flagged,
        "by_set": dict(c.by_set),
        "first": [
            {
                "prompt_id": f.prompt_id,
                "eval_set": f.eval_set,
                "eval_id": f.eval_id,
                "score": f.score,
                "rule": f.rule,
            }
            for f in c.first
        ],
    }


def contamination_of(doc: Any) -> Contamination:
    d = _object(doc)
    first = []
    for f in d.get("first") or []:
        f = _object(f)
        first.append(
            FlaggedPrompt(
                str(f.get("prompt_id")),
                str(f.get("eval_set")),
                str(f.get("eval_id")),
                float(f.get("score") or 0.0),
                "exact" if f.get("rule") == "exact" else "ngram",
            )
        )
    by_set = d.get("by_set")
    return Contamination(
        int(d.get("checked") or 0),
        int(d.get("flagged") or 0),
        _counts(by_set) if by_set is not None else {},
        tuple(first),
    )


# --- the records --------------------------------------------------------------------------------

#: the ledger's schema (``schema.VERSION`` when written); read by the open before anything else
SCHEMA_VERSION: MetaKey[int] = MetaKey("schema_version", _as_is, _int)
#: the schema a migration started from
MIGRATED_FROM: MetaKey[int] = MetaKey("migrated_from", _as_is, _int)
#: the manifest the last writer opened the run with, credentials redacted
#: (``session.settings.stored_manifest``); ``store.runs.manifest_of_run`` loads it back
MANIFEST: MetaKey[dict[str, Any]] = MetaKey("manifest", _as_is, _object)
#: the folder the manifest's relative paths were resolved against
MANIFEST_BASE_DIR: MetaKey[str] = MetaKey("manifest_base_dir", _as_is, _str)
#: the argv of the last command that opened the run to add answers (what the report shows)
COMMAND_LINE: MetaKey[list[str]] = MetaKey("command_line", list, _strings)
#: the gate on the validation, as the run decided it (the export manifest's ``gate``)
GATE: MetaKey[GateRecord] = MetaKey("gate", gate_json, gate_of)
#: what makes a dataset's samples mean what they mean: a rerun that changes it is refused
SETTINGS: PerDataset[DatasetSettings] = PerDataset("settings", _settings_json, _settings)
#: a dataset's ``limit`` (null: none) when the run last read it; ``--extend`` may raise it
LIMIT: PerDataset[int | None] = PerDataset("limit", _as_is, _limit)
#: prompts left out when a dataset was read, by reason (duplicate, contaminated:<set>, ...)
READ_DROPS: PerDataset[dict[str, int]] = PerDataset("read_drops", _counts_json, _counts)
#: the ``[run] decontaminate`` tally of a dataset when it was read
CONTAMINATION: PerDataset[Contamination] = PerDataset(
    "contamination", contamination_json, contamination_of
)
#: answers whose server ``usage`` was not taken as it is, by why (``invalid``, ``under``)
USAGE_NOTES: PerDataset[dict[str, int]] = PerDataset("usage_notes", _counts_json, _counts)


def _counting(doc: Any) -> Counting:
    if not isinstance(doc, dict):
        raise TypeError("not a JSON object")
    end, extra, why = doc.get("end_marker"), doc.get("prompt_extra"), doc.get("reasoning")
    return Counting(
        None if end is None else bool(end),
        bool(doc.get("think_opener_in_completion", False)),
        None if extra is None else int(extra),
        why if isinstance(why, str) else None,
    )


#: per server (``tokens.counts.server_key``: its base URL): how it counts ``usage``, as its own
#: ids showed it (``tokens.counts.fit``)
COUNTING: PerDataset[Counting] = PerDataset("counting", asdict, _counting)


class Meta(Part):
    """The ``meta`` table: the records above, read and written by their keys."""

    @overload
    def get(self, key: MetaKey[T]) -> T | None: ...

    @overload
    def get(self, key: MetaKey[T], default: D) -> T | D: ...

    def get(self, key: MetaKey[Any], default: Any = None) -> Any:
        """The record under ``key``, or ``default`` where the ledger holds none."""
        return self._get(key, default)

    @guarded
    def _get(self, key: MetaKey[Any], default: Any) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key.key,)).fetchone()
        if row is None:
            return default
        try:
            return key.load(json.loads(row[0]))
        except (ValueError, TypeError, KeyError) as e:
            raise LedgerError(
                f"{self.path}: its meta record {key.key!r} is not one draftdata wrote ({e}); "
                f"restore the ledger from a backup, or move {self.path.parent} aside to start "
                "the run afresh"
            ) from e

    def schema_version(self) -> int | None:
        """The ledger's schema, None for a new file. Not guarded: the open reads it first, and
        says itself what a file it cannot read is."""
        if not has_table(self.db, "meta"):
            return None
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (SCHEMA_VERSION.key,))
        got = row.fetchone()
        return SCHEMA_VERSION.load(json.loads(got[0])) if got else None

    @guarded
    def put(self, key: MetaKey[T], value: T) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)", (key.key, json.dumps(key.dump(value)))
        )
