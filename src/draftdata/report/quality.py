"""The report's quality section, near the top of the page, and its lines in the summary: how many
samples of each dataset each quality check (``tokens.quality.QUALITY_CHECKS``) fired on, the
first examples of each with the end of their answer, the notes about the data (heavy truncation),
and the contamination ``[run] decontaminate`` found when the prompts were read."""

from __future__ import annotations

from collections import Counter

from ..tokens.quality import QUALITY_CHECKS
from .alerts import alerts
from .data import QualityExample, ReportData, Tally
from .figures import pct, text_table
from .page import PageBase
from .svg import Raw, esc, hint, table

__all__ = ["QualitySections", "contamination_lines", "example_text", "quality_lines"]


def dropped(data: ReportData, name: str) -> Counter[str]:
    """Samples of a dataset taken out for a check: by ``[run] drop`` (the tokens stage's
    ``quality:<check>`` drops) and by ``export --drop`` (the manifest's ``filtered``)."""
    out: Counter[str] = Counter()
    for reason, n in (data.ds_manifest(name).get("drops") or {}).items():
        if str(reason).startswith("quality:") and isinstance(n, int):
            out[str(reason).removeprefix("quality:")] += n
    filtered = (data.manifest.get("filtered") or {}).get(name) or {}
    if isinstance(filtered, dict):
        out.update({str(k): int(v) for k, v in filtered.items() if isinstance(v, int)})
    return out


def count_cell(data: ReportData, name: str, check: str) -> str:
    """``n (share)`` of one dataset's samples a check fired on, and what was dropped for it."""
    t = data.ds_tokens(name)
    n, gone = t.warnings.get(check, 0), dropped(data, name).get(check, 0)
    text = f"{n:,} ({pct(n / t.rows)})" if n and t.rows else f"{n:,}"
    return text + (f" +{gone:,} dropped" if gone else "")


def example_text(e: QualityExample) -> str:
    """The end of an example's answer: its text, or its last ids where there is no text."""
    if e.text is not None:
        return "…" + e.text
    return "ids …" + " ".join(str(i) for i in e.tail_ids[-16:])


def _examples(data: ReportData) -> list[tuple[str, str, QualityExample]]:
    return [
        (name, check, e)
        for name in data.datasets
        for check, _ in QUALITY_CHECKS
        for e in data.ds_tokens(name).examples.get(check, [])
    ]


def _match_rows(data: ReportData) -> list[list[object]]:
    return [
        [name, pid, m.eval_set, m.eval_id, f"{m.score:.2f}", m.rule]
        for name, t in data.contamination.items()
        for pid, m in t.first
    ]


def _tally_cells(t: Tally | None) -> list[str]:
    if t is None:
        return ["not checked", "–", "–"]
    by = ", ".join(f"{k} {v:,}" for k, v in sorted(t.flagged.items())) or "none"
    return [f"{t.checked:,}", f"{t.total:,}", by]


def contamination_names(data: ReportData) -> list[str]:
    return list(dict.fromkeys([*data.datasets, *data.contamination]))


class QualitySections(PageBase):
    def quality(self) -> str:
        d = self.d
        head = "".join(
            f'<th class=n title="{esc(desc)}">{esc(name)}</th>' for name, desc in QUALITY_CHECKS
        )
        body = "".join(
            f"<tr><td>{self.ds(name)}</td><td class=n>{d.ds_tokens(name).rows:,}</td>"
            + "".join(f"<td class=n>{esc(count_cell(d, name, c))}</td>" for c, _ in QUALITY_CHECKS)
            + "</tr>"
            for name in d.datasets
        )
        out = [
            "<h2 id=quality>Quality</h2>",
            hint(
                "Samples each quality check fired on (kept, with the check's name among the "
                "sample's <code>warnings</code>), and their share of the dataset's samples; "
                "<b>dropped</b> samples were taken out for it (<code>[run] drop</code> or "
                "<code>export --drop</code>). Hover a column for what the check means."
            ),
            f'<div class="tablewrap"><table class="quality"><thead><tr><th>dataset</th>'
            f"<th class=n>samples</th>{head}</tr></thead><tbody>{body}</tbody></table></div>",
            "<dl class=checks>"
            + "".join(f"<dt>{esc(n)}</dt><dd>{esc(desc)}</dd>" for n, desc in QUALITY_CHECKS)
            + "</dl>",
        ]
        notes = "".join(f"<li>{esc(a.text)}</li>" for a in alerts(d, "note"))
        if notes:
            out.append(f'<div class="notes"><strong>Notes</strong><ul>{notes}</ul></div>')
        rows = [
            [self.ds(name), check, e.id, Raw(f"<pre>{esc(example_text(e))}</pre>")]
            for name, check, e in _examples(d)
        ]
        if rows:
            out += [
                "<h3>Examples</h3>",
                hint("The first samples of each dataset each check fired on (at most 3)."),
                table("dataset|check|sample|end of the answer", rows),
            ]
        return "".join(out) + self.contamination()

    def contamination(self) -> str:
        d = self.d
        out = ["<h3 id=contamination>Contamination</h3>"]
        sets = d.decontaminate()
        if not sets and not d.contamination:
            return "".join(out) + hint(
                "Not checked: the run had no <code>[run] decontaminate</code>, so its prompts "
                "were not compared with evaluation prompts."
            )
        out.append(
            hint(
                f"Prompts compared with {esc(', '.join(sets) or 'evaluation prompts')} when they "
                "were read; a flagged prompt was dropped before it was asked."
            )
        )
        rows = [
            [self.ds(n) if n in self.colors else n, *_tally_cells(d.contamination.get(n))]
            for n in contamination_names(d)
        ]
        out.append(table("dataset|checked|flagged|flagged by set", rows))
        if matches := _match_rows(d):
            out += [
                "<h4>First matches</h4>",
                table("dataset|prompt id|evaluation set|evaluation id|score|rule", matches),
            ]
        return "".join(out)


# --- the summary -------------------------------------------------------------------------------
def quality_lines(data: ReportData) -> list[str]:
    """The summary's quality table (a line per dataset, a column per check), its notes and
    the first examples of each check."""
    head = ["quality", "samples", *(name for name, _ in QUALITY_CHECKS)]
    rows = [
        [name, f"{data.ds_tokens(name).rows:,}"]
        + [count_cell(data, name, c) for c, _ in QUALITY_CHECKS]
        for name in data.datasets
    ]
    lines = text_table(head, rows)
    lines += [f"note: {a.text}" for a in alerts(data, "note")]
    lines += [f"  {name} {check} {e.id}: {example_text(e)!r}" for name, check, e in _examples(data)]
    return lines


def contamination_lines(data: ReportData) -> list[str]:
    sets = data.decontaminate()
    if not sets and not data.contamination:
        return ["contamination: not checked (no [run] decontaminate)"]
    lines = [f"contamination ({', '.join(sets) or 'checked'}):"]
    for name in contamination_names(data):
        t = data.contamination.get(name)
        if t is None:
            lines.append(f"  {name}: not checked")
            continue
        _, total, by = _tally_cells(t)
        lines.append(f"  {name}: {total} of {t.checked:,} prompts flagged ({by})")
        lines += [
            f"    {pid} ~ {m.eval_set} {m.eval_id} (score {m.score:.2f}, {m.rule})"
            for pid, m in t.first
        ]
    return lines
