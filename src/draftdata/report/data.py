"""The run report: one self-contained HTML page (inline CSS and SVG, no network) and a terminal
summary, from a run folder's ``export/manifest.json``, its Parquet shards and ``ledger.sqlite``.

Shards are streamed batch by batch; lengths are kept as value counts (bounded by the longest
sequence, not by the number of rows), so a report over millions of samples holds no rows."""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import InputError

__all__ = ["DatasetTokens", "ReportData", "Throughput", "build_report", "collect", "summary"]

SHARD_COLUMNS = (
    "dataset",
    "input_ids",
    "loss_mask",
    "prompt_len",
    "token_source",
    "finish_reason",
    "warnings",
)
REQUIRED_COLUMNS = ("dataset", "input_ids", "prompt_len")
BATCH_ROWS = 2048


# --- what the report is made of ------------------------------------------------------------------
@dataclass
class DatasetTokens:
    """What the shards hold for one dataset."""

    rows: int = 0
    tokens: int = 0
    trained: int = 0  # loss_mask True
    prompt_lens: Counter[int] = field(default_factory=Counter)
    response_lens: Counter[int] = field(default_factory=Counter)
    token_sources: Counter[str] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)


@dataclass
class Throughput:
    """What the ledger says about one dataset's requests."""

    work: Counter[str] = field(default_factory=Counter)  # state -> keys
    attempts: int = 0
    ok: int = 0
    active_s: float = 0.0  # union of the attempts' [start, start + latency] intervals
    responses: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_p50: float | None = None
    latency_p95: float | None = None
    errors: Counter[tuple[str, int | None]] = field(default_factory=Counter)

    @property
    def failed_attempts(self) -> int:
        return self.attempts - self.ok

    @property
    def requests_per_s(self) -> float | None:
        return self.attempts / self.active_s if self.active_s > 0 else None

    @property
    def completion_tokens_per_s(self) -> float | None:
        return self.completion_tokens / self.active_s if self.active_s > 0 else None


@dataclass
class ReportData:
    run_dir: Path
    manifest: dict[str, Any]
    datasets: list[str]
    tokens: dict[str, DatasetTokens]
    ledger: dict[str, Throughput] | None  # None: no ledger.sqlite in the run folder
    ledger_total: Throughput | None
    notes: list[str]  # inconsistencies found while reading

    def ds_manifest(self, name: str) -> dict[str, Any]:
        d = self.manifest.get("datasets", {}).get(name)
        return d if isinstance(d, dict) else {}

    def ds_tokens(self, name: str) -> DatasetTokens:
        return self.tokens.get(name) or DatasetTokens()

    def ds_ledger(self, name: str) -> Throughput | None:
        return None if self.ledger is None else self.ledger.get(name, Throughput())

    def validation(self) -> dict[str, Any] | None:
        v = self.manifest.get("validation")
        return v if isinstance(v, dict) else None


# --- reading -----------------------------------------------------------------------------------
def load_manifest(run_dir: Path) -> dict[str, Any]:
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run folder; pass the run's output folder")
    path = run_dir / "export" / "manifest.json"
    if not path.is_file():
        raise InputError(
            f"{path} not found; run `draftdata run MANIFEST` (or `draftdata export {run_dir}`) "
            "first"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(
            f"{path}: not readable JSON ({e}); re-run `draftdata export {run_dir}`"
        ) from e
    if not isinstance(doc, dict) or not isinstance(doc.get("datasets"), dict):
        raise InputError(
            f"{path}: not an export manifest (no 'datasets' object); "
            f"re-run `draftdata export {run_dir}`"
        )
    return doc


def _shard_paths(run_dir: Path, manifest: Mapping[str, Any], notes: list[str]) -> list[Path]:
    export = run_dir / "export"
    listed = manifest.get("shards")
    if not isinstance(listed, list) or not listed:
        found = sorted(export.glob("shard-*.parquet"))
        notes.append(f"manifest.json lists no shards; read the {len(found)} shard-*.parquet found")
        return found
    paths = []
    for s in listed:
        if not isinstance(s, dict) or not isinstance(s.get("path"), str):
            raise InputError(
                f"{export / 'manifest.json'}: shard entry {s!r} has no path; "
                f"re-run `draftdata export {run_dir}`"
            )
        p = export / s["path"]
        if not p.is_file():
            raise InputError(
                f"{p} (listed in manifest.json) not found; re-run `draftdata export {run_dir}`"
            )
        if isinstance(s.get("bytes"), int) and p.stat().st_size != s["bytes"]:
            notes.append(f"{s['path']}: {p.stat().st_size:,} bytes, manifest says {s['bytes']:,}")
        paths.append(p)
    return paths


def _count(counter: Counter[Any], arr: Any) -> None:
    import pyarrow.compute as pc

    for item in pc.value_counts(arr).to_pylist():
        if item["values"] is not None:
            counter[item["values"]] += item["counts"]


def scan_shards(
    run_dir: Path, manifest: Mapping[str, Any], notes: list[str]
) -> dict[str, DatasetTokens]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: dict[str, DatasetTokens] = {}
    rows_by_path = {
        str(s.get("path")): s.get("rows")
        for s in manifest.get("shards") or []
        if isinstance(s, dict)
    }
    for path in _shard_paths(run_dir, manifest, notes):
        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise InputError(
                f"{path}: not a readable Parquet file ({e}); re-run `draftdata export {run_dir}`"
            ) from e
        names = set(pf.schema_arrow.names)
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise InputError(
                f"{path}: no column {', '.join(missing)}; re-run `draftdata export {run_dir}` "
                f"with this draftdata ({__version__})"
            )
        rows = 0
        for batch in pf.iter_batches(
            batch_size=BATCH_ROWS, columns=[c for c in SHARD_COLUMNS if c in names]
        ):
            rows += batch.num_rows
            ds_col = batch.column("dataset")
            uniq = [d for d in pc.unique(ds_col).to_pylist() if d is not None]
            for ds in uniq:
                sub = batch if len(uniq) == 1 else batch.filter(pc.equal(ds_col, ds))
                t = out.setdefault(ds, DatasetTokens())
                lens = pc.cast(pc.list_value_length(sub.column("input_ids")), pa.int64())
                plen = pc.cast(sub.column("prompt_len"), pa.int64())
                t.rows += sub.num_rows
                t.tokens += pc.sum(lens).as_py() or 0
                _count(t.prompt_lens, plen)
                _count(t.response_lens, pc.subtract(lens, plen))
                if "loss_mask" in names:
                    t.trained += pc.sum(pc.list_flatten(sub.column("loss_mask"))).as_py() or 0
                if "token_source" in names:
                    _count(t.token_sources, sub.column("token_source"))
                if "finish_reason" in names:
                    _count(t.finish_reasons, sub.column("finish_reason"))
                if "warnings" in names:
                    _count(t.warnings, pc.list_flatten(sub.column("warnings")))
        expected = rows_by_path.get(path.name) or rows_by_path.get(
            str(path.relative_to(run_dir / "export"))
        )
        if isinstance(expected, int) and expected != rows:
            notes.append(f"{path.name}: {rows:,} rows, manifest says {expected:,}")
    return out


def _active_seconds(intervals: Iterator[tuple[float, float]]) -> float:
    """Length of the union of [start, start + duration] intervals sorted by start: time spent
    with at least one request in flight (a resumed run's pauses are not counted)."""
    total = 0.0
    cur_start: float | None = None
    cur_end = 0.0
    for start, dur in intervals:
        end = start + max(dur, 0.0)
        if cur_start is None or start > cur_end:
            if cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_start is not None:
        total += cur_end - cur_start
    return total


def _latency(db: sqlite3.Connection, where: str, args: tuple[Any, ...], n: int, q: float) -> float:
    row = db.execute(
        f"SELECT latency_s FROM attempts WHERE ok=1 {where} ORDER BY latency_s LIMIT 1 OFFSET ?",
        (*args, min(n - 1, int(q * n))),
    ).fetchone()
    return float(row[0])


def _throughput(db: sqlite3.Connection, dataset: str | None) -> Throughput:
    where, args = ("AND dataset=?", (dataset,)) if dataset is not None else ("", ())
    t = Throughput()
    for state, n in db.execute(
        f"SELECT state, count(*) FROM work WHERE 1=1 {where} GROUP BY state", args
    ):
        t.work[state] += n
    t.attempts, t.ok = db.execute(
        f"SELECT count(*), coalesce(sum(ok), 0) FROM attempts WHERE 1=1 {where}", args
    ).fetchone()
    t.active_s = _active_seconds(
        db.execute(
            f"SELECT started_at, latency_s FROM attempts WHERE 1=1 {where} ORDER BY started_at",
            args,
        )
    )
    if t.ok:
        t.latency_p50 = _latency(db, where, args, t.ok, 0.5)
        t.latency_p95 = _latency(db, where, args, t.ok, 0.95)
    t.responses, t.prompt_tokens, t.completion_tokens, t.cost_usd = db.execute(
        "SELECT count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0),"
        f" coalesce(sum(cost_usd), 0) FROM responses WHERE 1=1 {where}",
        args,
    ).fetchone()
    for reason, status, n in db.execute(
        f"SELECT coalesce(reason, 'unknown'), http_status, count(*) FROM attempts WHERE ok=0 "
        f"{where} GROUP BY 1, 2",
        args,
    ):
        t.errors[(reason, status)] += n
    return t


def read_ledger(run_dir: Path) -> tuple[dict[str, Throughput], Throughput] | None:
    path = run_dir / "ledger.sqlite"
    if not path.is_file():
        return None
    try:
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=30)
        try:
            names = [r[0] for r in db.execute("SELECT DISTINCT dataset FROM work ORDER BY 1")]
            per = {name: _throughput(db, name) for name in names}
            return per, _throughput(db, None)
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        raise InputError(
            f"{path}: not a readable draftdata ledger ({e}); point the report at the run folder "
            "that `draftdata generate` wrote"
        ) from e


def _fingerprint(run_dir: Path) -> tuple[tuple[str, int, int], ...]:
    files = [run_dir / "export" / "manifest.json", run_dir / "ledger.sqlite"]
    files += [run_dir / "ledger.sqlite-wal", *sorted((run_dir / "export").glob("**/*.parquet"))]
    out = []
    for p in files:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((str(p.resolve()), st.st_mtime_ns, st.st_size))
    return tuple(out)


# the last run read, so that `build_report` then `summary` reads the shards once
_last: list[tuple[tuple[tuple[str, int, int], ...], ReportData]] = []


def collect(run_dir: Path) -> ReportData:
    """Everything the page and the summary show, read from the run folder (reused while the
    run's files are unchanged)."""
    run_dir = Path(run_dir)
    key = _fingerprint(run_dir) if run_dir.is_dir() else ()
    if key and _last and _last[0][0] == key:
        return _last[0][1]
    data = _collect(run_dir)
    _last[:] = [(key, data)]
    return data


def _collect(run_dir: Path) -> ReportData:
    manifest = load_manifest(run_dir)
    notes: list[str] = []
    tokens = scan_shards(run_dir, manifest, notes)
    led = read_ledger(run_dir)
    if led is None:
        notes.append("ledger.sqlite not found in the run folder: no throughput or error figures")
    names = list(manifest["datasets"])
    names += sorted(set(tokens) - set(names))
    for name in names:
        want = (manifest["datasets"].get(name) or {}).get("samples")
        have = tokens.get(name, DatasetTokens()).rows
        if isinstance(want, int) and want != have:
            notes.append(
                f"dataset {name}: the shards hold {have:,} samples, manifest says {want:,}"
            )
    return ReportData(
        run_dir, manifest, names, tokens, led[0] if led else None, led[1] if led else None, notes
    )


# --- figures shared by the page and the summary --------------------------------------------------
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


# --- the terminal summary ------------------------------------------------------------------------
def _table(head: list[str], rows: list[list[str]]) -> list[str]:
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


def summary_of(data: ReportData) -> str:
    m = data.manifest
    tok = m.get("tokenizer") or {}
    fmt = m.get("format") or {}
    total = sum(t.rows for t in data.tokens.values())
    tokens = sum(t.tokens for t in data.tokens.values())
    trained = sum(t.trained for t in data.tokens.values())
    verdict, why = gate_verdict(m)
    lines = [
        f"run {m.get('run', data.run_dir.name)} · draftdata {m.get('draftdata_version', '?')} · "
        f"exported {m.get('created_at', '?')}",
        f"tokenizer sha256 {str(tok.get('sha256', '?'))[:16]}… · format {fmt.get('name', '?')} "
        f"v{fmt.get('version', '?')}",
        f"gate {verdict}" + (f": {why}" if why else ""),
        f"{total:,} samples in {len(data.datasets)} datasets · {tokens:,} tokens · "
        f"{pct(trained / tokens if tokens else None)} trained (loss mask)",
        "",
    ]
    val = data.validation() or {}
    by_src = val.get("by_source") or {}
    head = [
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
                num(lg.requests_per_s if lg else None),
                num(lg.completion_tokens_per_s if lg else None),
            ]
        )
    lines += _table(head, rows)
    drops: Counter[str] = Counter()
    for name in data.datasets:
        for stage, reason, n in drop_rows(data.ds_manifest(name)):
            drops[f"{stage}:{reason}"] += n
    lines.append("")
    lines.append("drops: " + (", ".join(f"{k} {n:,}" for k, n in drops.most_common()) or "none"))
    if data.ledger_total is not None:
        lt = data.ledger_total
        errs = ", ".join(f"{r} {n:,}" for (r, _), n in lt.errors.most_common(5)) or "none"
        lines.append(
            f"requests: {lt.attempts:,} attempts, {lt.failed_attempts:,} failed ({errs}); "
            f"{num(lt.requests_per_s)} req/s, {num(lt.completion_tokens_per_s)} completion tok/s"
        )
    lines.append(
        f"cost {usd(m.get('cost_usd', data.ledger_total.cost_usd if data.ledger_total else None))}"
    )
    lines += [f"note: {n}" for n in data.notes]
    return "\n".join(lines)


# --- entry points ------------------------------------------------------------------------------
def build_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the HTML report of a run (``RUN/report.html`` by default) and return its path."""
    from .html import render_html

    run_dir = Path(run_dir)
    page = render_html(collect(run_dir))
    target = Path(out) if out is not None else run_dir / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{target}: cannot write the report ({e.strerror}); check the path") from e
    return target


def summary(run_dir: Path) -> str:
    """Plain-text lines with the run's key figures, for the terminal."""
    return summary_of(collect(Path(run_dir)))
