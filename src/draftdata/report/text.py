"""The terminal summary of a run: a few lines with the key figures."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .alerts import alerts
from .data import ReportData, Throughput, collect
from .figures import (
    PROBE_LINE,
    drop_rows,
    duration,
    gate_verdict,
    num,
    pct,
    quantile,
    rate,
    text_table,
    truncated_share,
    usd,
)
from .quality import contamination_lines, quality_lines

#: the columns of the summary's table, one row per dataset
DATASET_HEAD = [
    "dataset",
    "samples",
    "resp p50",
    "trained",
    "truncated",
    "exact",
    "cost",
    "req/s",
    "tok/s",
]


def summary_of(data: ReportData) -> str:
    m = data.manifest
    lines = _head_lines(data)
    lines += [f"warning: {a.text}" for a in alerts(data, "error")]
    lines.append("")
    lines += text_table(DATASET_HEAD, _dataset_rows(data))
    lines.append("")
    lines += quality_lines(data)
    lines += contamination_lines(data)
    lines.append("")
    lines.append(_drops_line(data))
    if data.ledger_total is not None:
        lines += _request_lines(data.ledger_total)
    sc = data.scores
    if sc:
        lines.append(
            f"model scores ({sc.get('model', '?')}): {sc.get('samples', 0):,} samples, "
            f"{sc.get('flagged_samples', 0):,} flagged (log p below {sc.get('threshold')}), "
            f"{sc.get('repairs', 0):,} repairs"
        )
    lines.append(
        f"cost {usd(m.get('cost_usd', data.ledger_total.cost_usd if data.ledger_total else None))}"
    )
    lines += [f"note: {n}" for n in data.notes]
    return "\n".join(lines)


def _head_lines(data: ReportData) -> list[str]:
    """The run, its tokenizer and format, the gate and the totals."""
    m = data.manifest
    tok = m.get("tokenizer") or {}
    fmt = m.get("format") or {}
    total = sum(t.rows for t in data.tokens.values())
    tokens = sum(t.tokens for t in data.tokens.values())
    trained = sum(t.trained for t in data.tokens.values())
    verdict, why = gate_verdict(m)
    return [
        f"run {m.get('run', data.run_dir.name)} · draftdata {m.get('draftdata_version', '?')} · "
        f"exported {m.get('created_at', '?')}",
        f"tokenizer sha256 {str(tok.get('sha256', '?'))[:16]}… · format {fmt.get('name', '?')} "
        f"v{fmt.get('version', '?')}",
        f"gate {verdict}" + (f": {why}" if why else ""),
        f"{total:,} samples in {len(data.datasets)} datasets · {tokens:,} tokens · "
        f"{pct(trained / tokens if tokens else None)} trained (loss mask)",
    ]


def _dataset_rows(data: ReportData) -> list[list[str]]:
    """A row of ``DATASET_HEAD`` for each dataset."""
    val = data.validation() or {}
    by_src = val.get("by_source") or {}
    rows = []
    for name in data.datasets:
        t, d, lg = data.ds_tokens(name), data.ds_manifest(name), data.ds_ledger(name)
        exact = (by_src.get(name) or {}).get("exact_match_rate")
        rows.append(
            [
                name,
                f"{t.rows:,}",
                num(quantile(t.response_lens, 0.5), 0),
                pct(t.trained / t.tokens if t.tokens else None),
                pct(truncated_share(t.finish_reasons or d.get("finish_reasons") or {})),
                pct(exact),
                usd(d.get("cost_usd", lg.cost_usd if lg else None)),
                rate(lg.requests_per_s if lg else None),
                rate(lg.completion_tokens_per_s if lg else None),
            ]
        )
    return rows


def _drops_line(data: ReportData) -> str:
    """The samples dropped, by stage and reason over every dataset."""
    drops: Counter[str] = Counter()
    for name in data.datasets:
        for stage, reason, n in drop_rows(data.ds_manifest(name)):
            drops[f"{stage}:{reason}"] += n
    return "drops: " + (", ".join(f"{k} {n:,}" for k, n in drops.most_common()) or "none")


def _request_lines(lt: Throughput) -> list[str]:
    """The ledger's requests: attempts, failures by reason and the rates."""
    errs = ", ".join(f"{r} {n:,}" for (r, _), n in lt.errors.most_common(5)) or "none"
    rates = (
        f"no rates ({lt.rate_note}: too few to rate)"
        if lt.rate_note
        else f"{rate(lt.requests_per_s)} req/s, {rate(lt.completion_tokens_per_s)} "
        f"completion tok/s over {duration(lt.wall_s)} of wall time"
    )
    lines = [f"requests: {lt.attempts:,} attempts, {lt.failed_attempts:,} failed ({errs}); {rates}"]
    if lt.probe_refused:
        lines.append(f"{PROBE_LINE}: {lt.probe_refused:,} attempts, not counted as failed")
    return lines


def summary(run_dir: Path) -> str:
    """Plain-text lines with the run's key figures, for the terminal."""
    return summary_of(collect(Path(run_dir)))
