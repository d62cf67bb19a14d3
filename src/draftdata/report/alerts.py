"""Warnings the page shows at its top and the summary prints: things a user must look at before
training on the run (a gate that measured nothing), and notes about the data that belong beside
the quality table (heavy truncation).

An alert's ``level`` says where it goes: ``"error"`` is a red headline at the top of the page (the
data or its measurement is wrong), ``"note"`` an amber note under the quality table. Heavy
truncation is a note: a cut answer is a quality fact the run's own ``max_tokens`` decides (the
demo's small budget cuts most answers), not a failure of the data's exactness."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .data import ReportData
from .figures import gated_nothing

#: a dataset is heavily truncated where more than this share of its samples hit max_tokens
TRUNCATED_SHARE = 0.5


@dataclass(frozen=True)
class Alert:
    kind: str  # "truncation" | "gate"
    text: str
    dataset: str | None = None
    level: str = "error"  # "error": a red headline | "note": an amber note by the quality table


def finish_reasons(data: ReportData, name: str) -> Counter[str]:
    """A dataset's finish reasons: from the shards, else from the manifest."""
    t = data.ds_tokens(name)
    return t.finish_reasons or Counter(data.ds_manifest(name).get("finish_reasons") or {})


def truncation_alerts(data: ReportData) -> list[Alert]:
    out = []
    for name in data.datasets:
        finish = finish_reasons(data, name)
        total, cut = sum(finish.values()), finish.get("length", 0)
        if not total or cut <= TRUNCATED_SHARE * total:
            continue
        mt = (data.ds_manifest(name).get("sampling") or {}).get("max_tokens")
        limit = f"max_tokens = {mt:,}" if isinstance(mt, int) else "max_tokens"
        out.append(
            Alert(
                "truncation",
                f"{name}: {cut:,} of {total:,} samples ({cut / total:.0%}) were cut off at "
                f'max_tokens (finish_reason "length"), so they never show the model ending its '
                f"turn; {limit} may be too low for this dataset: raise it in the manifest's "
                "sampling",
                name,
                level="note",
            )
        )
    return out


def gate_alerts(data: ReportData) -> list[Alert]:
    why = gated_nothing(data.manifest)
    if why is None:
        return []
    g = data.manifest.get("gate")
    reason = str(g.get("reason") or "") if isinstance(g, dict) else ""
    extra = f" (the gate says: {reason})" if reason and reason not in why else ""
    return [
        Alert(
            "gate",
            f"Nothing was gated: {why}{extra}; no verdict is given.",
        )
    ]


def alerts(data: ReportData, level: str | None = None) -> list[Alert]:
    """Every warning for the run, the gate's first; only those of ``level`` where given."""
    out = gate_alerts(data) + truncation_alerts(data)
    return [a for a in out if level is None or a.level == level]
