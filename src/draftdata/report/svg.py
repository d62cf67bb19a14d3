"""Building blocks of the run report page: inline SVG plots (histograms, bar charts) and HTML
tables, no dependencies.

Every plot is one ``<svg>`` element as a string. Sizes are in viewBox units; the page scales the
element to the width of its container, so the plots stay sharp at any width. All text that
reaches the markup is escaped here, except ``Raw`` markup built by the report itself."""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from ..shown import visible

# Okabe-Ito (readable with the common colour-vision deficiencies), then two darker extras.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C6D31", "#6A3D9A")
INK = "#1f2933"
MUTED = "#616e7c"
GRID = "#e4e7eb"
AXIS = "#9aa5b1"
CHAR_W = 7.0  # average glyph width at font-size 12, for laying out labels


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def esc(value: object) -> str:
    """``value`` as HTML text: escaped, its control bytes visible (a page holds none raw)."""
    return escape(visible(str(value)), quote=True)


def short_num(v: float) -> str:
    """A tick label: 1500 -> 1.5k, 2000000 -> 2M, 0.25 -> 0.25."""
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    if a == 0 or a >= 1:
        return f"{v:.4g}"
    return f"{v:.2g}"


def nice_step(span: float, target: int) -> float:
    """A step of 1, 2, 2.5 or 5 times a power of ten giving about ``target`` steps over span."""
    if span <= 0:
        return 1.0
    raw = span / max(target, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def share(v: float) -> str:
    """A share as a percentage: whole percents without decimals (tick labels), else one."""
    return f"{v:.0%}" if abs(v * 100 - round(v * 100)) < 1e-9 else f"{v:.1%}"


def nice_ticks(hi: float, target: int = 5, integer: bool = False) -> list[float]:
    """Ticks from 0 to at least ``hi``; whole numbers only with ``integer``."""
    step = nice_step(hi, target)
    if integer:
        step = float(max(1, math.ceil(step)))
    n = max(1, math.ceil(hi / step - 1e-9))
    return [i * step for i in range(n + 1)]


def bin_edges(max_value: int, target_bins: int = 32) -> list[int]:
    """Integer bin edges [0, w, 2w, ...] covering 0..max_value inclusive, w a nice width."""
    width = max(1, math.ceil(nice_step(max_value + 1, target_bins)))
    n = max(1, math.ceil((max_value + 1) / width))
    return [i * width for i in range(n + 1)]


def _svg(w: float, h: float, label: str, body: list[str]) -> str:
    return (
        f'<svg class="plot" viewBox="0 0 {w:g} {h:g}" width="100%" role="img" '
        f'aria-label="{esc(label)}" xmlns="http://www.w3.org/2000/svg" '
        f'font-size="12" fill="{INK}">' + "".join(body) + "</svg>"
    )


def _text(x: float, y: float, s: str, anchor: str = "start", **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{esc(s)}</text>'


def _clip(label: str, width_px: float) -> str:
    n = max(3, int(width_px / CHAR_W))
    return label if len(label) <= n else label[: n - 1] + "…"


def _label_width(labels: Sequence[str]) -> float:
    """Room for the longest label (up to 26 characters; longer ones are cut with an ellipsis)."""
    return min(max((len(s) for s in labels), default=4), 26) * CHAR_W + 16


@dataclass(frozen=True)
class _Frame:
    """A histogram's plot area in viewBox units, and the values its axes span: x from ``lo``
    to ``hi``, y from 0 to ``ytop``."""

    w: float
    h: float
    left: float
    right: float
    top: float
    bottom: float
    lo: int
    hi: int
    ytop: float

    @property
    def pw(self) -> float:
        return self.w - self.left - self.right

    @property
    def ph(self) -> float:
        return self.h - self.top - self.bottom

    def sx(self, v: float) -> float:
        return self.left + (v - self.lo) / (self.hi - self.lo) * self.pw

    def sy(self, v: float) -> float:
        return self.top + self.ph - v / self.ytop * self.ph


def histogram(
    counts: Mapping[int, int],
    edges: Sequence[int],
    *,
    title: str,
    xlabel: str,
    ylabel: str = "samples",
    fill: str = PALETTE[0],
    marker: tuple[float, str] | None = None,
) -> str:
    """A bar histogram of integer values (``counts``: value -> number of samples) over the
    given bin edges; ``marker`` draws a dashed vertical line with a label (e.g. max_tokens)."""
    bins = _bins(counts, edges)
    ymax = max(bins) if bins and max(bins) > 0 else 1
    yticks = nice_ticks(ymax, 4, integer=True)
    f = _Frame(400.0, 220.0, 46.0, 16.0, 30.0, 40.0, edges[0], edges[-1], yticks[-1])
    body = [_text(f.left, 16, title, font_weight="600", font_size="13")]
    body += _y_grid(f, yticks)
    body += _bars(f, bins, edges, fill, ylabel)
    body += _x_axis(f)
    if not any(bins):
        body.append(
            _text(f.left + f.pw / 2, f.top + f.ph / 2, f"no {ylabel}", "middle", fill=MUTED)
        )
    if marker is not None and f.lo <= marker[0] <= f.hi:
        body += _marker(f, marker)
    body.append(_text(f.left + f.pw / 2, f.h - 6, xlabel, "middle", fill=MUTED))
    body.append(
        _text(
            12,
            f.top + f.ph / 2,
            ylabel,
            "middle",
            fill=MUTED,
            transform=f"rotate(-90 12 {f.top + f.ph / 2})",
        )
    )
    return _svg(f.w, f.h, f"{title}: histogram of {xlabel}", body)


def _bins(counts: Mapping[int, int], edges: Sequence[int]) -> list[int]:
    """The number of samples in each bin; values outside the edges go to the nearest bin."""
    bins = [0] * (len(edges) - 1)
    for value, n in counts.items():
        i = min(max(bisect_right(edges, value) - 1, 0), len(bins) - 1)
        bins[i] += n
    return bins


def _y_grid(f: _Frame, yticks: Sequence[float]) -> list[str]:
    """A grid line and a label at each of the y axis's ticks."""
    body = []
    for t in yticks:
        y = f.sy(t)
        body.append(
            f'<line x1="{f.left}" x2="{f.w - f.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>'
        )
        body.append(_text(f.left - 6, y + 4, short_num(t), "end", fill=MUTED))
    return body


def _bars(
    f: _Frame, bins: Sequence[int], edges: Sequence[int], fill: str, ylabel: str
) -> list[str]:
    """A bar for each bin that holds samples, its range and count in its tooltip."""
    body = []
    for i, n in enumerate(bins):
        if not n:
            continue
        x0, x1 = f.sx(edges[i]), f.sx(edges[i + 1])
        y = f.sy(n)
        tip = f"{edges[i]}–{edges[i + 1] - 1}: {n:,} {ylabel}"
        body.append(
            f'<rect x="{x0 + 0.5:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 1, 0.8):.1f}" '
            f'height="{f.top + f.ph - y:.1f}" fill="{fill}"><title>{esc(tip)}</title></rect>'
        )
    return body


def _x_axis(f: _Frame) -> list[str]:
    """The x axis: its ticks with their labels, then its line."""
    body = []
    base = f.top + f.ph
    for t in nice_ticks(f.hi - f.lo, 6, integer=True):
        if f.lo + t > f.hi:
            break
        x = f.sx(f.lo + t)
        body.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base}" y2="{base + 4}" stroke="{AXIS}"/>'
        )
        body.append(_text(x, base + 16, short_num(f.lo + t), "middle", fill=MUTED))
    body.append(
        f'<line x1="{f.left}" x2="{f.w - f.right}" y1="{base}" y2="{base}" stroke="{AXIS}"/>'
    )
    return body


def _marker(f: _Frame, marker: tuple[float, str]) -> list[str]:
    """The marker's dashed vertical line, and its legend (a dashed stroke and the label) at the
    top right."""
    x = f.sx(marker[0])
    lx = f.w - f.right - len(marker[1]) * CHAR_W
    return [
        f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{f.top}" y2="{f.top + f.ph}" stroke="{INK}" '
        'stroke-dasharray="4 3" stroke-width="1.2"/>',
        f'<line x1="{lx - 26:.1f}" x2="{lx - 8:.1f}" y1="12" y2="12" stroke="{INK}" '
        'stroke-dasharray="4 3" stroke-width="1.2"/>',
        _text(f.w - f.right, 16, marker[1], "end", fill=MUTED),
    ]


def hbars(
    rows: Sequence[tuple[str, float, str]],
    *,
    title: str,
    xlabel: str,
    fmt: Callable[[float], str] = short_num,
    xmax: float | None = None,
    integer: bool = False,
) -> str:
    """Horizontal bars, one per (label, value, colour) row, each with its value printed;
    the axis runs to ``xmax`` when given, else to a nice number above the largest value."""
    label_w = _label_width([r[0] for r in rows])
    w, bar_h, gap = 420.0, 18.0, 8.0
    left, right, top, bottom = label_w, 70.0, 28.0, 38.0
    pw = w - left - right
    h = top + bottom + len(rows) * (bar_h + gap)
    hi = xmax if xmax is not None else (max((r[1] for r in rows), default=0.0) or 1.0)
    ticks = [t for t in nice_ticks(hi, 4, integer) if t <= hi * 1.0001]
    if xmax is None:
        ticks = nice_ticks(hi, 4, integer)
        hi = ticks[-1]
    body = [_text(8, 16, title, font_weight="600", font_size="13")]
    ybase = top + len(rows) * (bar_h + gap)
    for t in ticks:
        x = left + t / hi * pw
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{ybase}" stroke="{GRID}"/>')
        body.append(_text(x, ybase + 14, fmt(t), "middle", fill=MUTED))
    for i, (label, value, fill) in enumerate(rows):
        y = top + i * (bar_h + gap) + gap / 2
        bw = max(value, 0.0) / hi * pw
        body.append(_text(left - 8, y + bar_h * 0.72, _clip(label, label_w - 12), "end"))
        body.append(
            f'<rect x="{left}" y="{y:.1f}" width="{bw:.1f}" height="{bar_h}" fill="{fill}">'
            f"<title>{esc(label)}: {esc(fmt(value))}</title></rect>"
        )
        body.append(_text(left + bw + 5, y + bar_h * 0.72, fmt(value)))
    body.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{ybase}" stroke="{AXIS}"/>')
    body.append(_text(left + pw / 2, h - 6, xlabel, "middle", fill=MUTED))
    return _svg(w, h, title, body)


def stacked_shares(
    rows: Sequence[tuple[str, Mapping[str, int]]],
    *,
    title: str,
    colors: Mapping[str, str],
    xlabel: str = "share of samples",
) -> str:
    """One 100% bar per (label, {category: count}) row, categories in ``colors`` order, with a
    legend; segments wide enough carry their percentage."""
    label_w = _label_width([r[0] for r in rows])
    w, bar_h, gap = 420.0, 20.0, 8.0
    left, right = label_w, 22.0
    pw = w - left - right
    # legend rows: as many entries per line as fit
    legend: list[list[str]] = [[]]
    used = 0.0
    for k in colors:
        need = len(k) * CHAR_W + 26
        if legend[-1] and used + need > w - 16:
            legend.append([])
            used = 0.0
        legend[-1].append(k)
        used += need
    top = 26 + len(legend) * 16 + 6
    h = top + len(rows) * (bar_h + gap) + 36
    body = [_text(8, 16, title, font_weight="600", font_size="13")]
    for li, line in enumerate(legend):
        x = 8.0
        y = 26.0 + li * 16
        for k in line:
            body.append(
                f'<rect x="{x:.1f}" y="{y + 2:.1f}" width="10" height="10" fill="{colors[k]}"/>'
            )
            body.append(_text(x + 14, y + 11, k, fill=MUTED))
            x += len(k) * CHAR_W + 26
    ybase = top + len(rows) * (bar_h + gap)
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = left + t * pw
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{ybase}" stroke="{GRID}"/>')
        body.append(_text(x, ybase + 14, f"{t:.0%}", "middle", fill=MUTED))
    for i, (label, parts) in enumerate(rows):
        y = top + i * (bar_h + gap) + gap / 2
        total = sum(parts.values())
        body.append(_text(left - 8, y + bar_h * 0.72, _clip(label, label_w - 12), "end"))
        if not total:
            body.append(_text(left + 6, y + bar_h * 0.72, "no samples", fill=MUTED))
        x = float(left)
        for k in colors:
            n = parts.get(k, 0)
            if not n or not total:
                continue
            share = n / total
            bw = share * pw
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bar_h}" '
                f'fill="{colors[k]}"><title>{esc(label)} · {esc(k)}: {n:,} '
                f"({share:.1%})</title></rect>"
            )
            if bw > 34:
                body.append(
                    _text(x + bw / 2, y + bar_h * 0.72, f"{share:.0%}", "middle", fill="#fff")
                )
            x += bw
    body.append(_text(left + pw / 2, h - 6, xlabel, "middle", fill=MUTED))
    return _svg(w, h, title, body)


# --- HTML blocks ---------------------------------------------------------------------------------
# a cell whose text is a number, a share, money, a size or a duration: right-aligned
NUMERIC = re.compile(r"^(–|\$?-?[\d,.]+( ?(%|ms|s|B|kB|MB|GB|TB))?|\d+m \d+s|\d+h \d+m)$")


class Raw(str):
    """Markup built by this module; table cells of any other type are escaped."""


def cell(v: object) -> str:
    return v if isinstance(v, Raw) else esc(v)


def table(head: str, rows: Sequence[Sequence[object]], total: Sequence[object] = ()) -> Raw:
    """A table with columns ``head`` ("a|b|c"); a column whose cells all read as numbers is
    right-aligned; ``total`` is a bold last row."""
    cols = head.split("|")
    every = [*rows, total] if total else list(rows)

    def numeric(i: int) -> bool:
        cells = [str(r[i]) for r in every if not isinstance(r[i], Raw)]
        return bool(cells) and all(NUMERIC.match(c) for c in cells)

    align = [" class=n" if numeric(i) else "" for i in range(len(cols))]

    def tr(r: Sequence[object], tag: str = "td", cls: str = "") -> str:
        return (
            f"<tr{cls}>"
            + "".join(f"<{tag}{a}>{cell(v)}</{tag}>" for a, v in zip(align, r, strict=True))
            + "</tr>"
        )

    body = "".join(tr(r) for r in rows) + (tr(total, cls=" class=total") if total else "")
    return Raw(
        f'<div class="tablewrap"><table><thead>{tr(cols, "th")}</thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def charts(svgs: Iterable[str]) -> Raw:
    return Raw(
        '<div class="grid">' + "".join(f'<div class="chart">{s}</div>' for s in svgs) + "</div>"
    )


def split(left: str, chart: str) -> Raw:
    """Tables beside the chart that draws them; stacked on narrow screens."""
    return Raw(f'<div class="split"><div>{left}</div><div class="chart">{chart}</div></div>')


def hint(html: str) -> str:
    return f'<p class="hint">{html}</p>'


def known_first(known: Mapping[str, str]) -> Callable[[str], tuple[int, str]]:
    """Sort key: the keys of ``known`` in their order, then the others by name."""
    order = list(known)
    return lambda k: (order.index(k) if k in order else len(order), k)


def palette_for(keys: Iterable[str], fixed: Mapping[str, str]) -> dict[str, str]:
    """Fixed colours for known keys, then the palette's unused colours for the rest."""
    keys = sorted(set(keys), key=known_first(fixed))
    spare = [c for c in PALETTE if c not in fixed.values()]
    return {k: fixed.get(k) or spare[i % len(spare)] for i, k in enumerate(keys)}


def counts(c: Mapping[str, int], keys: Sequence[str]) -> list[str]:
    return [f"{c.get(k, 0):,}" for k in keys]
