"""The page's shared state (``PageBase``) and its exactness section, which is the longest: token
sources per dataset, validated exact-match, mismatch categories with examples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from .alerts import finish_reasons
from .data import ReportData
from .figures import gate_verdict, pct
from .style import SOURCE_COLORS
from .svg import (
    Raw,
    color,
    counts,
    esc,
    hbars,
    hint,
    palette_for,
    share,
    split,
    stacked_shares,
    table,
)


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


class PageBase:
    def __init__(self, data: ReportData) -> None:
        self.d = data
        self.m = data.manifest
        self.val = data.validation()
        self.colors = {name: color(i) for i, name in enumerate(data.datasets)}
        self.rows = sum(t.rows for t in data.tokens.values())
        self.tokens = sum(t.tokens for t in data.tokens.values())
        self.trained = sum(t.trained for t in data.tokens.values())

    def ds(self, name: str) -> Raw:
        sw = f'<span class="sw" style="background:{self.colors[name]}"></span>'
        return Raw(f'<span class="ds">{sw}{esc(name)}</span>')

    def sources(self, name: str) -> Counter[str]:
        t = self.d.ds_tokens(name)
        return t.token_sources or Counter(self.d.ds_manifest(name).get("token_sources") or {})

    def finish(self, name: str) -> Counter[str]:
        return finish_reasons(self.d, name)

    def gate(self) -> Raw:
        verdict, why = gate_verdict(self.m)
        kind = "forced" if "FORCED" in verdict else {"PASSED": "pass", "FAILED": "fail"}
        cls = kind if isinstance(kind, str) else kind.get(verdict, "none")
        return Raw(f'<span class="badge {cls}">{esc(verdict)}</span> {esc(why)}')


class ExactnessSections(PageBase):
    def exactness(self) -> str:
        out = [self.sources_table(), self.sample_warnings()]
        val = self.val
        if val is None:
            out.append(
                hint(
                    "No validation in the manifest: no dataset had ground truth, so "
                    "exactness was not measured."
                )
            )
            return "".join(out)
        out += [
            self.validation_tables(val),
            self.lossy_labels(val),
            self.validation_counts(val),
            self.mismatches(val),
        ]
        return "".join(out)

    def sources_table(self) -> str:
        """The section's head: the gate, then where each dataset's ids come from beside each
        dataset's validated exact match."""
        d, g = self.d, self.m.get("gate") or {}
        by_src: dict[str, Any] = (self.val or {}).get("by_source") or {}
        colors = palette_for((s for n in d.datasets for s in self.sources(n)), SOURCE_COLORS)
        rows = [
            [
                self.ds(n),
                *counts(self.sources(n), list(colors)),
                f"{v['n']:,}" if "n" in v else "–",
                pct(v.get("exact_match_rate")),
                pct(v.get("token_accuracy"), 2),
            ]
            for n, v in ((n, by_src.get(n) or {}) for n in d.datasets)
        ]
        return "".join(
            [
                "<h2 id=exactness>Exactness</h2>",
                f'<div class="panel"><strong>Gate</strong> {self.gate()}<br><span class=muted>'
                "The export refuses a run whose validated exact-match rate is below the minimum "
                f"unless it is forced. Forced: {'yes' if g.get('forced') else 'no'}.</span></div>",
                hint(
                    "Where the ids come from: <b>engine</b> ids are the model's own; "
                    "<b>logprobs</b> ids are looked up from the returned token bytes; "
                    "<b>reconstructed</b> ids re-tokenize the response text, and validation "
                    "against ground truth measures how exact they are (exact match: every id of "
                    "prompt and response equal)."
                ),
                split(
                    table(
                        "|".join(["dataset", *colors, "validated|exact match|token accuracy"]),
                        rows,
                    ),
                    stacked_shares(
                        [(n, self.sources(n)) for n in d.datasets],
                        title="Token sources by dataset",
                        colors=colors,
                    ),
                ),
            ]
        )

    def sample_warnings(self) -> str:
        """The samples' warnings, counted per dataset; nothing where there are none."""
        warn = [
            [self.ds(n), w, f"{c:,}"]
            for n in self.d.datasets
            for w, c in self.d.ds_tokens(n).warnings.most_common()
        ]
        return "<h3>Sample warnings</h3>" + table("dataset|warning|samples", warn) if warn else ""

    def validation_tables(self, val: dict[str, Any]) -> str:
        """Validation against ground truth: the totals and each source's figures, beside a bar
        of each source's exact match."""
        by_src: dict[str, Any] = val.get("by_source") or {}
        lossless = (
            "no lossless views to measure"
            if val.get("lossless") == 0
            else pct(val.get("lossless_exact_match_rate"))
        )
        totals = [
            [
                f"{val.get('n', 0):,}" if val.get("n") else "nothing measured",
                f"{val.get('exact', 0):,}",
                pct(val.get("exact_match_rate")),
                lossless,
                pct(val.get("token_accuracy"), 2),
                pct(val.get("prompt_exact_rate")),
            ]
        ]
        srows = [
            [
                self.ds(s) if s in self.colors else s,
                f"{v.get('n', 0):,}",
                f"{v.get('exact', 0):,}",
                pct(v.get("exact_match_rate")),
                pct(v.get("token_accuracy"), 2),
                ", ".join(f"{c} {k}" for c, k in sorted((v.get("categories") or {}).items()))
                or "–",
            ]
            for s, v in sorted(by_src.items())
        ]
        bars = [
            (s, float(v.get("exact_match_rate") or 0), self.colors.get(s, "#3e4c59"))
            for s, v in sorted(by_src.items())
        ]
        return "<h3>Validation against ground truth</h3>" + split(
            table(
                "records|exact|exact match|exact match, lossless views|token accuracy|prompt exact",
                totals,
            )
            + table("source|records|exact|exact match|token accuracy|mismatches", srows),
            hbars(
                bars,
                title="Exact match by source",
                xlabel="exact-match rate",
                xmax=1.0,
                fmt=share,
            ),
        )

    def validation_counts(self, val: dict[str, Any]) -> str:
        """The records validation dropped, and its warnings, by reason."""
        out = []
        for title, key in (("Validation drops", "drops"), ("Validation warnings", "warnings")):
            if items := Counter(val.get(key) or {}):
                out.append(
                    f"<h3>{title}</h3>"
                    + table("reason|records", [[k, f"{n:,}"] for k, n in items.most_common()])
                )
        return "".join(out)

    def mismatches(self, val: dict[str, Any]) -> str:
        """The mismatched records by category, with examples; nothing where none mismatched."""
        cats: Counter[str] = Counter(val.get("categories") or {})
        if not cats:
            return ""
        chart = hbars(
            [(c, float(n), "#D55E00") for c, n in cats.most_common()],
            title="Mismatched records by category",
            xlabel="records",
            integer=True,
            fmt=lambda v: f"{v:,.0f}",
        )
        examples = "".join(
            self.examples(c, e) for c, e in sorted((val.get("examples") or {}).items())
        )
        return "<h3>Mismatches</h3>" + split(examples or hint("No examples."), chart)

    def lossy_labels(self, val: dict[str, Any]) -> str:
        """Each ``lossy:*`` label: the views that carried it and those whose guessed ids
        equalled the truth all the same."""
        labels = val.get("lossy_labels") or {}
        rows = [
            [k, f"{views:,}", f"{held:,}", pct(held / views if views else None)]
            for k, t in sorted(labels.items())
            if isinstance(t, dict)
            for views, held in [(int(t.get("views") or 0), int(t.get("held") or 0))]
        ]
        if not rows:
            return ""
        return (
            "<h3>Views that lost text at their server</h3>"
            + hint(
                "A server that loses text for good leaves the sample a <b>lossy:</b> label, and "
                "its ids there are the format's guess. On ground truth the guess is checked: a "
                "view whose ids equal the truth (the guess held) counts as exact, and the "
                "exact match above is over every view."
            )
            + table("label|views|held|held share", rows)
        )

    def examples(self, cat: str, exs: Sequence[Any]) -> str:
        cats = (self.val or {}).get("categories") or {}
        inner = "".join(
            f"<p><b>{esc(e.get('id'))}</b> <span class=muted>{esc(e.get('where'))} position "
            f"{esc(e.get('position'))}</span></p><pre>{esc(e.get('text'))}</pre>"
            f"<div class=mono>truth: {esc(e.get('truth'))}</div>"
            f"<div class=mono>ours:&nbsp; {esc(e.get('ours'))}</div>"
            for e in exs
            if isinstance(e, dict)
        )
        return (
            f"<details><summary>{esc(cat)} ({plural(cats.get(cat, len(exs)), 'record')})</summary>"
            f"{inner}</details>"
        )
