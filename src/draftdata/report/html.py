"""The run report's HTML page: inline CSS and SVG, no scripts, nothing fetched from the network.

Every value that comes from the run (dataset names, reasons, examples, paths) is escaped: table
cells are escaped unless they are ``Raw`` markup built here."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__
from .data import (
    ReportData,
    Throughput,
    drop_rows,
    duration,
    gate_verdict,
    mean,
    num,
    pct,
    quantile,
    size,
    truncated_share,
    usd,
)
from .svg import (
    Raw,
    bin_edges,
    cell,
    charts,
    color,
    counts,
    esc,
    hbars,
    hint,
    histogram,
    palette_for,
    share,
    short_num,
    split,
    stacked_shares,
    table,
)

SOURCE_COLORS = {"engine": "#009E73", "logprobs": "#0072B2", "reconstructed": "#E69F00"}
SECTIONS = {
    "datasets": "Datasets",
    "lengths": "Lengths",
    "loss-mask": "Loss mask",
    "exactness": "Exactness",
    "truncation": "Truncation and drops",
    "cost": "Cost and throughput",
    "shards": "Shards",
}
FINISH_COLORS = {"stop": "#009E73", "length": "#D55E00", "tool_calls": "#0072B2"}

CSS = """
:root{--ink:#1f2933;--muted:#616e7c;--line:#e4e7eb;--bg:#f5f7fa;--card:#fff;--accent:#0072B2;
--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:24px 20px 56px}
h1{font-size:26px;margin:0 0 2px}
h2{font-size:19px;margin:40px 0 12px;padding-bottom:6px;border-bottom:2px solid var(--line)}
h3{font-size:15px;margin:22px 0 8px}
p.lead,p.hint{color:var(--muted);margin:4px 0 12px}
a{color:var(--accent)}
nav{margin:16px 0 0;display:flex;flex-wrap:wrap;gap:6px}
nav a{padding:3px 10px;border:1px solid var(--line);border-radius:999px;background:var(--card);
text-decoration:none;font-size:13px}
.panel,.tablewrap,.kpi,.chart{background:var(--card);border:1px solid var(--line);border-radius:8px}
.panel{padding:14px 16px}
.prov{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:0}
.prov dt{color:var(--muted)} .prov dd{margin:0;overflow-wrap:anywhere}
.kpis{display:grid;grid-template-columns:repeat(4,1fr);gap:12px;margin:16px 0}
@media (min-width:1100px){.kpis{grid-template-columns:repeat(8,1fr)}}
@media (max-width:560px){.kpis{grid-template-columns:repeat(2,1fr)}}
.kpi{padding:10px 14px} .kpi .v{font-size:22px;font-weight:650;font-variant-numeric:tabular-nums}
.kpi .l{color:var(--muted);font-size:12px}
.tablewrap{overflow-x:auto;margin:0 0 12px}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
tr:last-child td{border-bottom:0}
th{font-weight:600;color:var(--muted);font-size:12px;background:#fafbfc;white-space:nowrap}
.n{text-align:right;white-space:nowrap}
tr.total td{font-weight:600;background:#fafbfc}
td:first-child{white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,380px),1fr));gap:14px}
.chart{padding:8px 10px} svg.plot{display:block;width:100%;height:auto}
.split{display:grid;grid-template-columns:minmax(0,3fr) minmax(280px,2fr);gap:14px;align-items:start;
margin:0 0 12px}
.split>div>.tablewrap:last-child{margin:0}
.split>div{min-width:0}
@media (max-width:900px){.split{grid-template-columns:minmax(0,1fr)}}
.ds{white-space:nowrap} .sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:7px}
.badge{display:inline-block;padding:2px 12px;border-radius:999px;font-weight:700;font-size:13px;
color:#fff;letter-spacing:.02em}
.pass{background:var(--ok)} .fail{background:var(--bad)} .forced{background:var(--warn)}
.none{background:#7b8794}
.notes{background:#fff8e5;border:1px solid #f0d48a;border-radius:8px;padding:10px 16px;margin:16px 0}
.notes ul{margin:4px 0;padding-left:20px}
code,.mono,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:var(--bg);padding:6px 8px;
border-radius:6px;margin:2px 0}
details{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:8px 14px;
margin:0 0 8px} summary{cursor:pointer;font-weight:600}
.muted{color:var(--muted)}
footer{margin-top:40px;color:var(--muted);font-size:12px}
@media print{body{background:#fff} nav{display:none}}
"""


class Page:
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
        t = self.d.ds_tokens(name)
        return t.finish_reasons or Counter(self.d.ds_manifest(name).get("finish_reasons") or {})

    # --- header ----------------------------------------------------------------------------
    def header(self) -> str:
        m, d, lt = self.m, self.d, self.d.ledger_total
        tok, fmt = m.get("tokenizer") or {}, m.get("format") or {}
        prov = [
            ("run", m.get("run", d.run_dir.name)),
            ("created", m.get("created_at", "?")),
            ("draftdata", m.get("draftdata_version", "?")),
            ("format", f"{fmt.get('name', '?')} v{fmt.get('version', '?')}"),
            ("tokenizer", tok.get("path", "?")),
            ("tokenizer sha256", Raw(f"<code>{esc(tok.get('sha256', '?'))}</code>")),
            (
                "chat template sha256",
                Raw(f"<code>{esc(tok.get('chat_template_sha256') or 'none')}</code>"),
            ),
            ("gate", self.gate()),
        ]
        kpis = [
            (f"{self.rows:,}", "samples"),
            (f"{len(d.datasets)}", "datasets"),
            (f"{self.tokens:,}", "tokens"),
            (pct(self.trained / self.tokens if self.tokens else None), "trained (loss mask)"),
            (pct((self.val or {}).get("exact_match_rate")), "validated exact match"),
            (usd(m.get("cost_usd", lt.cost_usd if lt else None)), "cost"),
            (num(lt.requests_per_s if lt else None), "requests / s"),
            (num(lt.completion_tokens_per_s if lt else None), "completion tokens / s"),
        ]
        notes = "".join(f"<li>{esc(n)}</li>" for n in d.notes)
        nav = "".join(f'<a href="#{k}">{v}</a>' for k, v in SECTIONS.items())
        return (
            f"<header><h1>Run report: {esc(m.get('run', d.run_dir.name))}</h1>"
            f'<p class="lead">{esc(d.run_dir)}</p><div class="panel"><dl class="prov">'
            + "".join(f"<dt>{esc(k)}</dt><dd>{cell(v)}</dd>" for k, v in prov)
            + '</dl></div><div class="kpis">'
            + "".join(
                f'<div class="kpi"><div class="v">{esc(v)}</div><div class="l">{esc(lab)}'
                "</div></div>"
                for v, lab in kpis
            )
            + "</div>"
            + (
                f'<div class="notes"><strong>Check these</strong><ul>{notes}</ul></div>'
                * bool(notes)
            )
            + f"<nav>{nav}</nav></header>"
        )

    def gate(self) -> Raw:
        verdict, why = gate_verdict(self.m)
        kind = "forced" if "FORCED" in verdict else {"PASSED": "pass", "FAILED": "fail"}
        cls = kind if isinstance(kind, str) else kind.get(verdict, "none")
        return Raw(f'<span class="badge {cls}">{esc(verdict)}</span> {esc(why)}')

    # --- sections --------------------------------------------------------------------------
    def datasets(self) -> str:
        rows = []
        for name in self.d.datasets:
            dm = self.d.ds_manifest(name)
            s, gt = dm.get("sampling") or {}, dm.get("ground_truth")
            rows.append(
                [self.ds(name), dm.get("backend", "–"), dm.get("backend_kind", "–")]
                + ["yes" if gt else "–" if gt is None else "no"]
                + [s.get(k, "–") for k in ("temperature", "top_p", "max_tokens", "seed")]
                + [f"{self.d.ds_tokens(name).rows:,}"]
            )
        head = "dataset|backend|kind|ground truth|temperature|top_p|max_tokens|seed|samples"
        return "<h2 id=datasets>Datasets</h2>" + table(head, rows)

    def lengths(self) -> str:
        d = self.d
        stats: list[Callable[[Counter[int]], float | None]] = [
            lambda c: quantile(c, 0.5),
            lambda c: quantile(c, 0.9),
            lambda c: max(c, default=None),
            mean,
        ]
        rows = [
            [self.ds(n), f"{t.rows:,}"]
            + [num(f(c), 0) for c in (t.prompt_lens, t.response_lens) for f in stats]
            for n, t in ((n, d.ds_tokens(n)) for n in d.datasets)
        ]
        head = "dataset|samples" + "".join(
            f"|{w} {s}" for w in ("prompt", "response") for s in ("p50", "p90", "max", "mean")
        )
        out = [
            "<h2 id=lengths>Lengths</h2>",
            hint(
                "Prompt length is <code>prompt_len</code>; response length is "
                "<code>len(input_ids) - prompt_len</code>, in tokens. Bins are shared across "
                "datasets; the dashed line marks the dataset's <code>max_tokens</code>."
            ),
            table(head, rows),
        ]
        for label, attr in (("Prompt length", "prompt_lens"), ("Response length", "response_lens")):
            by_ds = {n: getattr(d.ds_tokens(n), attr) for n in d.datasets}
            edges = bin_edges(max((max(c, default=0) for c in by_ds.values()), default=0))
            svgs = []
            for name, c in by_ds.items():
                mt = (d.ds_manifest(name).get("sampling") or {}).get("max_tokens")
                mark = (
                    (mt, f"max_tokens {mt}")
                    if attr == "response_lens" and isinstance(mt, int)
                    else None
                )
                svgs.append(
                    histogram(
                        c,
                        edges,
                        title=name,
                        xlabel=f"{label.lower()} (tokens)",
                        fill=self.colors[name],
                        marker=mark,
                    )
                )
            out += [f"<h3>{label}</h3>", charts(svgs)]
        return "".join(out)

    def loss_mask(self) -> str:
        d, rows, bars = self.d, [], []
        for name in d.datasets:
            t = d.ds_tokens(name)
            frac = t.trained / t.tokens if t.tokens else None
            per = t.trained / t.rows if t.rows else None
            rows.append([self.ds(name), f"{t.tokens:,}", f"{t.trained:,}", pct(frac), num(per)])
            bars.append((name, frac or 0.0, self.colors[name]))
        frac = self.trained / self.tokens if self.tokens else None
        per = self.trained / self.rows if self.rows else None
        total = ["all datasets", f"{self.tokens:,}", f"{self.trained:,}", pct(frac), num(per)]
        bars.append(("all datasets", frac or 0.0, "#3e4c59"))
        head = "dataset|tokens|trained tokens|trained share|trained per sample"
        chart = hbars(
            bars, title="Share of tokens trained on", xlabel="loss-mask share", fmt=share, xmax=1.0
        )
        return (
            "<h2 id=loss-mask>Loss mask</h2>"
            + hint(
                "Trained tokens are those with <code>loss_mask</code> true: the model's own "
                "output, which the drafter learns to predict."
            )
            + split(table(head, rows, total), chart)
        )

    def exactness(self) -> str:
        d, val, g = self.d, self.val, self.m.get("gate") or {}
        by_src: dict[str, Any] = (val or {}).get("by_source") or {}
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
        out = [
            "<h2 id=exactness>Exactness</h2>",
            f'<div class="panel"><strong>Gate</strong> {self.gate()}<br><span class=muted>The '
            "export refuses a run whose validated exact-match rate is below the minimum "
            f"unless it is forced. Forced: {'yes' if g.get('forced') else 'no'}.</span></div>",
            hint(
                "Where the ids come from: <b>engine</b> ids are the model's own; <b>logprobs</b> "
                "ids are looked up from the returned token bytes; <b>reconstructed</b> ids "
                "re-tokenize the response text, and validation against ground truth measures "
                "how exact they are (exact match: every id of prompt and response equal)."
            ),
            split(
                table("|".join(["dataset", *colors, "validated|exact match|token accuracy"]), rows),
                stacked_shares(
                    [(n, self.sources(n)) for n in d.datasets],
                    title="Token sources by dataset",
                    colors=colors,
                ),
            ),
        ]
        warn = [
            [self.ds(n), w, f"{c:,}"]
            for n in d.datasets
            for w, c in d.ds_tokens(n).warnings.most_common()
        ]
        if warn:
            out.append("<h3>Sample warnings</h3>" + table("dataset|warning|samples", warn))
        if val is None:
            out.append(
                hint(
                    "No validation in the manifest: no dataset had ground truth, so "
                    "exactness was not measured."
                )
            )
            return "".join(out)
        totals = [
            [
                f"{val.get('n', 0):,}",
                f"{val.get('exact', 0):,}",
                pct(val.get("exact_match_rate")),
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
        out += [
            "<h3>Validation against ground truth</h3>",
            split(
                table("records|exact|exact match|token accuracy|prompt exact", totals)
                + table("source|records|exact|exact match|token accuracy|mismatches", srows),
                hbars(
                    bars,
                    title="Exact match by source",
                    xlabel="exact-match rate",
                    xmax=1.0,
                    fmt=share,
                ),
            ),
        ]
        for title, key in (("Validation drops", "drops"), ("Validation warnings", "warnings")):
            if items := Counter(val.get(key) or {}):
                out.append(
                    f"<h3>{title}</h3>"
                    + table("reason|records", [[k, f"{n:,}"] for k, n in items.most_common()])
                )
        cats: Counter[str] = Counter(val.get("categories") or {})
        if cats:
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
            out += ["<h3>Mismatches</h3>", split(examples or hint("No examples."), chart)]
        return "".join(out)

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

    def truncation(self) -> str:
        d = self.d
        colors = palette_for((r for n in d.datasets for r in self.finish(n)), FINISH_COLORS)
        rows = [
            [
                self.ds(n),
                *counts(self.finish(n), list(colors)),
                pct(truncated_share(self.finish(n))),
                (d.ds_manifest(n).get("sampling") or {}).get("max_tokens", "–"),
            ]
            for n in d.datasets
        ]
        drows = []
        for name in d.datasets:
            dr, kept = drop_rows(d.ds_manifest(name)), d.ds_tokens(name).rows
            lost = sum(n for *_, n in dr)
            drows += [
                [self.ds(name), st, why, f"{n:,}", pct(n / (kept + lost))] for st, why, n in dr
            ]
        return "".join(
            [
                "<h2 id=truncation>Truncation and drops</h2>",
                hint(
                    "A <code>length</code> finish is a response cut at <code>max_tokens</code>: it "
                    "is kept, but it never shows the model ending its turn."
                ),
                split(
                    table("|".join(["dataset", *colors, "truncated|max_tokens"]), rows),
                    stacked_shares(
                        [(n, self.finish(n)) for n in d.datasets],
                        title="Finish reasons",
                        colors=colors,
                    ),
                ),
                "<h3>Drops by reason</h3>",
                hint(
                    "<b>read</b>: prompts the source reader could not use; <b>tokens</b>: answers "
                    "that could not be turned into exact ids. The share is of the dataset's "
                    "samples plus its drops."
                ),
                table("dataset|stage|reason|dropped|share", drows)
                if drows
                else hint("Nothing was dropped."),
            ]
        )

    def cost(self) -> str:
        d, lt = self.d, self.d.ledger_total
        rows, bars = [], []
        for name in d.datasets:
            dm, lg = d.ds_manifest(name), d.ds_ledger(name)
            cost = dm.get("cost_usd", lg.cost_usd if lg else None)
            rows.append(
                cost_row(self.ds(name), dm.get("backend", "–"), d.ds_tokens(name).rows, cost, lg)
            )
            bars.append((name, float(cost or 0.0), self.colors[name]))
        head = "dataset|backend|samples|cost|per sample|prompt tokens|completion tokens|per 1M completion tokens"
        out = [
            "<h2 id=cost>Cost and throughput</h2>",
            table(head, rows, cost_row("all datasets", "", self.rows, self.m.get("cost_usd"), lt)),
        ]
        cost_chart = hbars(
            bars, title="Cost by dataset", xlabel="USD", fmt=lambda v: f"${short_num(v)}"
        )
        if d.ledger is None or lt is None:
            out += [
                hint(
                    "No ledger.sqlite in the run folder: request rates, latencies and "
                    "errors are not available."
                ),
                charts([cost_chart]),
            ]
            return "".join(out)
        per = [(n, d.ledger.get(n, Throughput())) for n in d.datasets]
        lrows = [
            [
                label,
                *(f"{v:,}" for v in (lg.attempts, lg.ok, lg.failed_attempts)),
                *counts(lg.work, ["failed", "pending"]),
                duration(lg.active_s),
                num(lg.requests_per_s),
                num(lg.completion_tokens_per_s),
                duration(lg.latency_p50),
                duration(lg.latency_p95),
            ]
            for label, lg in [*((self.ds(n), lg) for n, lg in per), ("all datasets", lt)]
        ]

        def rate(f: Callable[[Throughput], float | None], title: str, unit: str) -> str:
            return hbars(
                [(n, f(lg) or 0.0, self.colors[n]) for n, lg in per],
                title=title,
                xlabel=unit,
                fmt=short_num,
            )

        erows = [
            [self.ds(n), why, "–" if st is None else st, f"{k:,}"]
            for n, lg in per
            for (why, st), k in lg.errors.most_common()
        ]
        out += [
            "<h3>Requests</h3>",
            hint(
                "Rates are over active time: the union of the attempts' [start, start + "
                "latency] intervals, so pauses between resumed runs do not count. Failed keys "
                "gave up after their retries; pending keys have no answer yet."
            ),
            table(
                "dataset|attempts|ok|failed attempts|failed keys|pending keys|active time|"
                "requests/s|completion tok/s|latency p50|latency p95",
                lrows[:-1],
                lrows[-1],
            ),
            charts(
                [
                    cost_chart,
                    rate(lambda lg: lg.requests_per_s, "Requests per second", "requests / s"),
                    rate(
                        lambda lg: lg.completion_tokens_per_s,
                        "Completion tokens per second",
                        "tokens / s",
                    ),
                ]
            ),
            "<h3>Failed attempts by reason</h3>",
            table("dataset|reason|HTTP status|attempts", erows)
            if erows
            else hint("No request failed."),
        ]
        return "".join(out)

    def shards(self) -> str:
        rows = [
            [
                s.get("path", "?"),
                f"{s.get('rows', 0):,}",
                size(s.get("bytes", 0)),
                Raw(f"<code>{esc(s.get('sha256', ''))}</code>"),
            ]
            for s in self.m.get("shards") or []
            if isinstance(s, dict)
        ]
        return "<h2 id=shards>Shards</h2>" + table("file|rows|size|sha256", rows)

    def render(self) -> str:
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        parts = (
            self.header,
            self.datasets,
            self.lengths,
            self.loss_mask,
            self.exactness,
            self.truncation,
            self.cost,
            self.shards,
        )
        title = f"draftdata report: {self.m.get('run', self.d.run_dir.name)}"
        return (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
            + "".join(part() for part in parts)
            + f"<footer>Made by draftdata {esc(__version__)} on {now} from {esc(self.d.run_dir)}."
            " Self-contained: no scripts, nothing loaded from the network.</footer>"
            "</main></body></html>\n"
        )


def cost_row(
    label: object, backend: str, n: int, cost: float | None, lg: Throughput | None
) -> list[object]:
    out_tok = lg.completion_tokens if lg else None
    return [
        label,
        backend,
        f"{n:,}",
        usd(cost),
        usd(cost / n if cost is not None and n else None),
        f"{lg.prompt_tokens:,}" if lg else "–",
        f"{out_tok:,}" if out_tok is not None else "–",
        usd(cost / out_tok * 1e6 if cost is not None and out_tok else None),
    ]


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def render_html(data: ReportData) -> str:
    return Page(data).render()
