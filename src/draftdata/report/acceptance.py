"""The report's acceptance section: each drafter ``draftdata evaluate`` measured on the run's
held-out prompts (``RUN/acceptance/*.json``): AL per dataset through the engine's own counters,
simulated beside it, tokens/s against the target alone, and acceptance by draft position as a
picture (one line per drafter and K, over every dataset)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..records.acceptance import drafter_name
from .page import PageBase
from .svg import AXIS, GRID, MUTED, _svg, _text, charts, color, esc, table

__all__ = ["AcceptanceSections", "by_position_chart"]


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "–" if x is None or math.isnan(x) else fmt.format(x)


def by_position_chart(rows: Sequence[tuple[str, Sequence[float]]]) -> str:
    """Acceptance rate (0-1) by draft position, one line and its points per (label, rates)."""
    k = max((len(r) for _, r in rows), default=1)
    w, h = 460.0, 260.0
    left, right, top = 44.0, 16.0, 28.0
    h += 16.0 * len(rows)
    pw, ph = w - left - right, 260.0 - top - 70.0

    def sx(i: int) -> float:
        return left + (i + 0.5) / k * pw

    def sy(v: float) -> float:
        return top + ph - v * ph

    title = "accepted share of draft steps, by draft position"
    body = [_text(8, 16, title, font_weight="600", font_size="13")]
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = sy(t)
        body.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>'
        )
        body.append(_text(left - 6, y + 4, f"{t:.2f}", "end", fill=MUTED))
    for i in range(k):
        body.append(_text(sx(i), top + ph + 16, str(i + 1), "middle", fill=MUTED))
    body.append(_text(left + pw / 2, top + ph + 34, "draft position", "middle", fill=MUTED))
    body.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="{AXIS}"/>')
    for n, (label, rates) in enumerate(rows):
        c = color(n)
        pts = [(sx(i), sy(v)) for i, v in enumerate(rates) if not math.isnan(v)]
        if len(pts) > 1:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            body.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        for (x, y), v in zip(pts, [v for v in rates if not math.isnan(v)], strict=True):
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{c}">'
                f"<title>{esc(label)}: {v:.3f}</title></circle>"
            )
        ly = top + ph + 56 + 16 * n
        body.append(f'<rect x="{left}" y="{ly - 9:.1f}" width="10" height="10" fill="{c}"/>')
        body.append(_text(left + 16, ly, label))
    return _svg(w, h, title, body)


class AcceptanceSections(PageBase):
    def acceptance(self) -> str:
        results = self.d.acceptance
        if not results:
            return ""
        rows = []
        for a in results:
            for d in (*a.datasets, a.total):
                e = d.engine
                rows.append(
                    [
                        a.method,
                        a.k,
                        drafter_name(a.drafter) or "–",
                        d.dataset,
                        f"{d.prompts:,}",
                        _num(e.al if e is not None else None),
                        " / ".join(_num(x, "{:.2f}") for x in e.by_position)
                        if e is not None
                        else "–",
                        _num(d.simulated.al if d.simulated is not None else None),
                        _num(d.al_difference, "{:+.3f}"),
                        _num(d.tokens_per_s, "{:.1f}"),
                        _num(d.speedup, "{:.2f}x"),
                    ]
                )
        lines = [
            (
                a.label,
                a.total.engine.by_position if a.total.engine is not None else (),
            )
            for a in results
        ]
        first = results[-1]
        intro = (
            "<p>Drafters measured with <code>draftdata evaluate</code> on each dataset's "
            "held-out prompts (those the run never asked), through the serving engine's own "
            "spec-decode counters: AL is 1 + accepted tokens per draft step (the bonus token "
            "included). <i>Simulated</i> is the same drafter run in process, teacher-forced over "
            f"the engine's answers; on greedy answers the two agree up to numerics (here within "
            f"{esc(_num(first.tolerance, '{:.2f}'))}). Tokens/s is against the same requests to "
            f"the target without a drafter. Temperature {esc(first.temperature)}, at most "
            f"{esc(first.max_tokens)} tokens per answer, engine {esc(first.engine)}.</p>"
        )
        return (
            "<h2 id=acceptance>Acceptance</h2>"
            + intro
            + table(
                "method|K|drafter|dataset|prompts|AL (engine)|accepted by position|AL (simulated)"
                "|simulated − engine|tokens/s|against the target alone",
                rows,
            )
            + charts([by_position_chart(lines)])
        )
