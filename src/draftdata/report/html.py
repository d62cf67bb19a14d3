"""The run report's HTML page: inline CSS and SVG, no scripts, nothing fetched from the network.

Every value that comes from the run (dataset names, reasons, examples, paths) is escaped: table
cells are escaped unless they are ``Raw`` markup built here."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Sequence

from ..store.stats import MIN_RATE_ATTEMPTS, MIN_RATE_WALL_S
from ..version import __version__
from .acceptance import AcceptanceSections
from .alerts import alerts
from .data import ReportData, Throughput
from .figures import (
    PROBE_LINE,
    drop_rows,
    duration,
    mean,
    num,
    pct,
    quantile,
    rate,
    size,
    truncated_share,
    usd,
)
from .page import ExactnessSections
from .quality import QualitySections
from .style import CSS, FINISH_COLORS, SECTIONS
from .svg import (
    Raw,
    bin_edges,
    cell,
    charts,
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
from .viewer import ViewerSections, command


class Page(QualitySections, ExactnessSections, ViewerSections, AcceptanceSections):
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
        if d.command_line:
            prov.append(("command", Raw(f"<code>{esc(command(d.command_line))}</code>")))
        why = lt.rate_note if lt else None
        no_rate = f'<div class="k">no rate: {esc(why)}</div>' if why else ""
        kpis = [
            (f"{self.rows:,}", "samples", ""),
            (f"{len(d.datasets)}", "datasets", ""),
            (f"{self.tokens:,}", "tokens", ""),
            (pct(self.trained / self.tokens if self.tokens else None), "trained (loss mask)", ""),
            (pct((self.val or {}).get("exact_match_rate")), "validated exact match", ""),
            (usd(m.get("cost_usd", lt.cost_usd if lt else None)), "cost", ""),
            (rate(lt.requests_per_s if lt else None), "requests / s", no_rate),
            (rate(lt.completion_tokens_per_s if lt else None), "completion tokens / s", no_rate),
        ]
        notes = "".join(f"<li>{esc(n)}</li>" for n in d.notes)
        warns = "".join(f"<li>{esc(a.text)}</li>" for a in alerts(d, "error"))
        shown = {k: v for k, v in SECTIONS.items() if k != "acceptance" or d.acceptance}
        nav = "".join(f'<a href="#{k}">{v}</a>' for k, v in shown.items())
        return (
            f"<header><h1>Run report: {esc(m.get('run', d.run_dir.name))}</h1>"
            f'<p class="lead">{esc(d.run_dir)}</p><div class="panel"><dl class="prov">'
            + "".join(f"<dt>{esc(k)}</dt><dd>{cell(v)}</dd>" for k, v in prov)
            + '</dl></div><div class="kpis">'
            + "".join(
                f'<div class="kpi"><div class="v">{esc(v)}</div><div class="l">{esc(lab)}'
                f"</div>{note}</div>"
                for v, lab, note in kpis
            )
            + "</div>"
            + (f'<div class="alerts"><strong>Warnings</strong><ul>{warns}</ul></div>' * bool(warns))
            + (
                f'<div class="notes"><strong>Check these</strong><ul>{notes}</ul></div>'
                * bool(notes)
            )
            + f"<nav>{nav}</nav></header>"
        )

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
        costs, cost_chart = self.cost_by_dataset()
        out = ["<h2 id=cost>Cost and throughput</h2>", costs]
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
        out += [
            self.request_table(per, lt),
            charts(
                [
                    cost_chart,
                    *self.rate_bars(
                        per, lambda lg: lg.requests_per_s, "Requests per second", "requests / s"
                    ),
                    *self.rate_bars(
                        per,
                        lambda lg: lg.completion_tokens_per_s,
                        "Completion tokens per second",
                        "tokens / s",
                    ),
                ]
            ),
            self.failures(per),
        ]
        if lt.probe_refused:
            out.append(probe_note(per, lt))
        return "".join(out)

    def cost_by_dataset(self) -> tuple[str, str]:
        """The table of each dataset's cost and tokens, with the run's total, and the chart of
        each dataset's cost."""
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
        costs = table(
            head, rows, cost_row("all datasets", "", self.rows, self.m.get("cost_usd"), lt)
        )
        chart = hbars(bars, title="Cost by dataset", xlabel="USD", fmt=lambda v: f"${short_num(v)}")
        return costs, chart

    def request_table(self, per: Sequence[tuple[str, Throughput]], lt: Throughput) -> str:
        """The ledger's requests per dataset and in all: attempts, failures, rates, latency."""
        lrows = [
            [
                label,
                *(f"{v:,}" for v in (lg.attempts, lg.ok, lg.failed_attempts)),
                *counts(lg.work, ["failed", "pending"]),
                duration(lg.wall_s),
                rate(lg.requests_per_s),
                rate(lg.completion_tokens_per_s),
                duration(lg.latency_p50),
                duration(lg.latency_p95),
            ]
            for label, lg in [*((self.ds(n), lg) for n, lg in per), ("all datasets", lt)]
        ]
        return (
            "<h3>Requests</h3>"
            + hint(
                "Rates are over wall time: from the first attempt's start to the last attempt's "
                "end (pauses between resumed runs count). A rate over fewer than "
                f"{MIN_RATE_ATTEMPTS} attempts or under {MIN_RATE_WALL_S:g} s of wall time is "
                "not given (–): it would say more about start-up than about the server. Failed "
                "keys gave up after their retries; pending keys have no answer yet."
            )
            + table(
                "dataset|attempts|ok|failed attempts|failed keys|pending keys|wall time|"
                "requests/s|completion tok/s|latency p50|latency p95",
                lrows[:-1],
                lrows[-1],
            )
        )

    def rate_bars(
        self,
        per: Sequence[tuple[str, Throughput]],
        f: Callable[[Throughput], float | None],
        title: str,
        unit: str,
    ) -> list[str]:
        """A bar per dataset with a rate; none where no dataset has one (not a row of 0s)."""
        bars = [(n, v, self.colors[n]) for n, lg in per if (v := f(lg)) is not None]
        return [hbars(bars, title=title, xlabel=unit, fmt=short_num)] if bars else []

    def failures(self, per: Sequence[tuple[str, Throughput]]) -> str:
        """Each dataset's failed attempts by reason and HTTP status."""
        erows = [
            [self.ds(n), why, "–" if st is None else st, f"{k:,}"]
            for n, lg in per
            for (why, st), k in lg.errors.most_common()
        ]
        return "<h3>Failed attempts by reason</h3>" + (
            table("dataset|reason|HTTP status|attempts", erows)
            if erows
            else hint("No request failed.")
        )

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

    def scores(self) -> str:
        sc = self.d.scores
        if not sc:
            return ""
        rows = [
            [
                g.get("dataset", "?"),
                g.get("token_source", "?"),
                f"{g.get('samples', 0):,}",
                f"{g.get('tokens', 0):,}",
                f"{g.get('mean_logprob', 0):.3f}",
                str(g.get("min_logprob")),
                f"{g.get('flagged_samples', 0):,}",
                ", ".join(f"{k} {v}" for k, v in sorted((g.get("flags_by_kind") or {}).items()))
                or "none",
                f"{g.get('repairs', 0):,}",
            ]
            for g in sc.get("groups") or []
            if isinstance(g, dict)
        ]
        intro = (
            f"<p>Teacher-forced log-probabilities from {esc(str(sc.get('model', '?')))}: a token "
            f"below {esc(str(sc.get('threshold')))} is one the model would almost never have "
            "produced (a wrong end marker, a control id injected from text).</p>"
        )
        return (
            "<h2 id=scores>Model scores</h2>"
            + intro
            + table(
                "dataset|token source|samples|trained tokens|mean log p|min log p|flagged samples"
                "|flags|repairs",
                rows,
            )
        )

    def render(self) -> str:
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        parts = (
            self.header,
            self.quality,
            self.datasets,
            self.samples,
            self.lengths,
            self.loss_mask,
            self.exactness,
            self.scores,
            self.acceptance,
            self.truncation,
            self.cost,
            self.shards,
            self.run_section,
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


def probe_note(per: Sequence[tuple[str, Throughput]], lt: Throughput) -> str:
    """The attempts a backend's probe for token ids was refused, which are not failures."""
    where = ", ".join(f"{n} {lg.probe_refused:,}" for n, lg in per if lg.probe_refused)
    return (
        f"<p><b>{esc(PROBE_LINE)}</b>: {lt.probe_refused:,} attempts ({esc(where)}). "
        '<span class="muted">The backend asked whether the server returns token ids, '
        "was told no, and went on without them; these attempts are not failures and are "
        "not counted above.</span></p>"
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


def render_html(data: ReportData) -> str:
    return Page(data).render()
