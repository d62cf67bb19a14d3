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


#: how the capability probe's expected refusal of return_token_ids is listed (not a failure)
PROBE_LINE = "capability probe: server refused return_token_ids (expected)"
#: the gate's reason where no dataset returns text only (``measure.gate.decide``)
NOT_GATED_REASON = "no text-only datasets"


def not_gated(g: Mapping[str, Any]) -> bool:
    """The gate had no dataset to gate (``gated`` false, or its reason says so)."""
    return g.get("gated") is False or NOT_GATED_REASON in str(g.get("reason") or "")


def gated_nothing(manifest: Mapping[str, Any]) -> str | None:
    """Why the export gate measured nothing (no gate, no rate, no text-only dataset), or None
    where it compared a measured rate with its minimum."""
    g = manifest.get("gate")
    if not isinstance(g, dict):
        return "the manifest records no gate"
    if not_gated(g):
        return (
            "no dataset returns text only, so no ids were reconstructed and the gate had "
            "nothing to check"
        )
    if g.get("exact_match_rate") is None:
        return "no ground-truth validation measured the exact-match rate"
    return None


def gate_verdict(manifest: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict word, one-line explanation) of the export gate. A gate that measured nothing
    says so (NOT GATED, NOT MEASURED): it never reads like a pass."""
    g = manifest.get("gate")
    if not isinstance(g, dict):
        return "NO GATE", "the manifest records no gate"
    rate, lo = g.get("exact_match_rate"), g.get("min_exact")
    nothing = gated_nothing(manifest)
    if nothing is not None:
        head = "NOT GATED" if not_gated(g) else "NOT MEASURED"
        why = [f"nothing was gated: {nothing}"]
        if rate is not None:
            why.append(f"validation measured {rate:.1%} exact match, for information only")
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


def rate(x: float | None) -> str:
    """A rate to three significant figures (never "0.0" for a small positive rate)."""
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if x >= 0.001 else f"{x:.1e}"


def text_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Plain-text columns for the summary: the first left-aligned, the others right."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = [head[0].ljust(widths[0])] + [
        h.rjust(w) for h, w in zip(head[1:], widths[1:], strict=True)
    ]
    out = ["  ".join(line).rstrip()]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    return out
