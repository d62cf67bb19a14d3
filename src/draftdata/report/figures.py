"""Figures and number formats shared by the page and the terminal summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def quantile(counts: Mapping[int, int], q: float) -> int | None:
    total = sum(counts.values())
    if not total:
        return None
    need = q * total
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= need:
            return value
    return max(counts)


def mean(counts: Mapping[int, int]) -> float | None:
    total = sum(counts.values())
    return sum(v * n for v, n in counts.items()) / total if total else None


def truncated_share(finish: Mapping[str, int]) -> float | None:
    total = sum(finish.values())
    return finish.get("length", 0) / total if total else None


def gate_verdict(manifest: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict word, one-line explanation) of the export gate."""
    g = manifest.get("gate")
    if not isinstance(g, dict):
        return "NO GATE", "the manifest records no gate"
    rate, lo = g.get("exact_match_rate"), g.get("min_exact")
    if rate is None:
        head, why = "NOT MEASURED", ["no ground-truth validation; exactness was not measured"]
    else:
        head = "PASSED" if g.get("passed") else "FAILED"
        cmp = "≥" if g.get("passed") else "<"
        why = [f"exact-match rate {rate:.1%} {cmp} minimum {lo:.1%}" if lo is not None else ""]
    if g.get("forced"):
        head += " (FORCED)"
        why.append("export was forced past the gate")
    return head, "; ".join(w for w in why if w)


def drop_rows(ds: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(stage, reason, count) of one dataset's drops in the manifest: reading, then tokens."""
    return [
        (stage, str(reason), int(n))
        for stage, key in (("read", "read_drops"), ("tokens", "drops"))
        for reason, n in sorted((ds.get(key) or {}).items(), key=lambda kv: -int(kv[1]))
    ]


def usd(x: float | None) -> str:
    if x is None:
        return "–"
    a = abs(x)
    return f"${x:,.2f}" if a >= 100 else f"${x:,.4f}" if a >= 0.01 or a == 0 else f"${x:.6f}"


def duration(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    return f"{m}m {sec:02d}s" if m < 60 else f"{m // 60}h {m % 60:02d}m"


def size(n: float) -> str:
    units = ("B", "kB", "MB", "GB", "TB")
    i = 0
    while abs(n) >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:,.0f} B" if i == 0 else f"{n:,.1f} {units[i]}"


def pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}%}"


def num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:,.{digits}f}"
