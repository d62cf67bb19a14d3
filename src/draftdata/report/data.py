"""What the run report is made of, read from a run folder's ``export/manifest.json``, its
Parquet shards, the sample preview ``export/preview.json`` and ``ledger.sqlite`` (through the
ledger's read-only figures and its meta table: the run's manifest and command line).

Shards are streamed batch by batch; lengths are kept as value counts (bounded by the longest
sequence, not by the number of rows), so a report over millions of samples holds no rows. The
quality table's examples are the exception, and bounded: the first ``EXAMPLES_PER_CHECK`` rows of
each dataset and check, each the last ``EXAMPLE_IDS`` ids of its answer, decoded with the
tokenizer the manifest pins (where its file is at hand). Contamination tallies come from the
ledger's meta (``store.meta.CONTAMINATION``)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..export.preview import PREVIEW_FILE, Preview, read_preview
from ..files import parquet_batches
from ..measure.contamination import Tally
from ..records.acceptance import ACCEPTANCE_DIR, Acceptance
from ..records.export import ExportManifest
from ..store.guard import reading
from ..store.ledger import Ledger, LedgerError
from ..store.meta import COMMAND_LINE, CONTAMINATION, MANIFEST
from ..store.stats import Throughput, throughput, work_datasets
from ..tokens.quality import QUALITY_CHECKS
from ..version import __version__

__all__ = [
    "DatasetTokens",
    "LedgerFigures",
    "Preview",
    "QualityExample",
    "ReportData",
    "Tally",
    "Throughput",
    "collect",
]

SHARD_COLUMNS = (
    "id",
    "dataset",
    "input_ids",
    "loss_mask",
    "prompt_len",
    "token_source",
    "finish_reason",
    "warnings",
)
REQUIRED_COLUMNS = ("dataset", "input_ids", "prompt_len")
QUALITY_NAMES = tuple(name for name, _ in QUALITY_CHECKS)
BATCH_ROWS = 2048
#: examples the report keeps of each quality check, per dataset (the first rows that carry it)
EXAMPLES_PER_CHECK = 3
#: answer ids kept of each example (its tail), enough for ``EXAMPLE_CHARS`` characters
EXAMPLE_IDS = 64
#: characters of each example's answer the report shows (its end)
EXAMPLE_CHARS = 80


@dataclass(frozen=True)
class QualityExample:
    """A sample a quality check fired on: its id, its answer's last ids, and their text (None
    where the export's tokenizer could not be loaded; ``decode_examples`` fills it)."""

    id: str
    tail_ids: tuple[int, ...]
    text: str | None = None


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
    #: check name -> the first ``EXAMPLES_PER_CHECK`` samples it fired on
    examples: dict[str, list[QualityExample]] = field(default_factory=dict)


@dataclass(frozen=True)
class LedgerFigures:
    """What the report reads from the ledger."""

    per_dataset: dict[str, Throughput]
    total: Throughput
    run_manifest: dict[str, Any] | None  # meta "manifest": the run's manifest as it was loaded
    command_line: list[str] | None  # meta "command_line": the argv that last opened the run
    #: meta "contamination:<dataset>": the tally ``[run] decontaminate`` saved when it was read
    contamination: dict[str, Tally] = field(default_factory=dict)


@dataclass
class ReportData:
    run_dir: Path
    #: export/manifest.json as written (the pages read fields a hand-made or older one may lack)
    manifest: dict[str, Any]
    datasets: list[str]
    tokens: dict[str, DatasetTokens]
    ledger: dict[str, Throughput] | None  # None: no ledger.sqlite in the run folder
    ledger_total: Throughput | None
    notes: list[str]  # inconsistencies found while reading
    preview: Preview | None = None  # None: the export wrote no preview.json (older exports)
    run_manifest: dict[str, Any] | None = None
    command_line: list[str] | None = None
    #: RUN/scores.json from the model stage (`score RUN` or `[model]` in the manifest)
    scores: dict[str, Any] | None = None
    #: the same manifest read as a record (``ExportManifest.from_json``)
    export: ExportManifest | None = None
    #: dataset -> its contamination tally, from the ledger (datasets the run checked)
    contamination: dict[str, Tally] = field(default_factory=dict)
    #: the drafters `draftdata evaluate` measured on the run (RUN/acceptance/*.json)
    acceptance: list[Acceptance] = field(default_factory=list)

    def decontaminate(self) -> list[str]:
        """The evaluation sets of the run's ``[run] decontaminate`` (empty: not checked)."""
        run = (self.run_manifest or {}).get("run")
        sets = run.get("decontaminate") if isinstance(run, dict) else None
        return [str(x) for x in sets] if isinstance(sets, list) else []

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
def read_export_record(run_dir: Path) -> tuple[ExportManifest, dict[str, Any]]:
    """export/manifest.json as a record, and the document it was read from."""
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
    try:
        return ExportManifest.from_json(doc), doc
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(
            f"{path}: not an export manifest ({e}); re-run `draftdata export {run_dir}`"
        ) from e


def _shard_paths(run_dir: Path, manifest: ExportManifest, notes: list[str]) -> list[Path]:
    export = run_dir / "export"
    if not manifest.shards:
        found = sorted(export.glob("shard-*.parquet"))
        notes.append(f"manifest.json lists no shards; read the {len(found)} shard-*.parquet found")
        return found
    paths = []
    for s in manifest.shards:
        p = export / s.path
        if not p.is_file():
            raise InputError(
                f"{p} (listed in manifest.json) not found; re-run `draftdata export {run_dir}`"
            )
        if s.bytes is not None and p.stat().st_size != s.bytes:
            notes.append(f"{s.path}: {p.stat().st_size:,} bytes, manifest says {s.bytes:,}")
        paths.append(p)
    return paths


def _count(counter: Counter[Any], arr: Any) -> None:
    import pyarrow.compute as pc

    for item in pc.value_counts(arr).to_pylist():
        if item["values"] is not None:
            counter[item["values"]] += item["counts"]


def scan_shards(
    run_dir: Path, manifest: ExportManifest, notes: list[str]
) -> dict[str, DatasetTokens]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: dict[str, DatasetTokens] = {}
    rows_by_path = {s.path: s.rows for s in manifest.shards}
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
        cols = [c for c in SHARD_COLUMNS if c in names]
        for batch in parquet_batches(pf, batch_size=BATCH_ROWS, columns=cols):
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
                    if "id" in names:
                        _take_examples(t, sub)
        expected = rows_by_path.get(path.name) or rows_by_path.get(
            str(path.relative_to(run_dir / "export"))
        )
        if expected is not None and expected != rows:
            notes.append(f"{path.name}: {rows:,} rows, manifest says {expected:,}")
    return out


def _take_examples(t: DatasetTokens, batch: Any) -> None:
    """The batch's first rows for each quality check still short of examples (looked up with
    Arrow: only the rows taken become Python objects)."""
    import pyarrow.compute as pc

    need = [
        c
        for c in QUALITY_NAMES
        if len(t.examples.get(c, ())) < EXAMPLES_PER_CHECK and t.warnings.get(c)
    ]
    if not need:
        return
    col = batch.column("warnings")
    flat, parents = pc.list_flatten(col), pc.list_parent_indices(col)
    for check in need:
        have = t.examples.setdefault(check, [])
        rows = pc.filter(parents, pc.equal(flat, check)).to_pylist()
        for i in rows[: EXAMPLES_PER_CHECK - len(have)]:
            plen = int(batch.column("prompt_len")[i].as_py() or 0)
            ids = batch.column("input_ids")[i].values.to_pylist()[plen:]
            have.append(
                QualityExample(str(batch.column("id")[i].as_py()), tuple(ids[-EXAMPLE_IDS:]))
            )


def decode_examples(
    tokens: dict[str, DatasetTokens], manifest: ExportManifest, notes: list[str]
) -> None:
    """Each example's answer tail as text, decoded with the export's tokenizer (where its file
    is at hand and is the one the manifest pins)."""
    if not any(t.examples for t in tokens.values()):
        return
    from ..errors import DraftdataError
    from ..tokenizers import load_tokenizer

    pin = manifest.tokenizer
    if not pin.path or not Path(pin.path).exists():
        notes.append(
            f"the export's tokenizer ({pin.path or 'no path'}) is not at hand: the quality "
            "examples show ids, not text"
        )
        return
    try:
        tok = load_tokenizer(pin.path)
    except (DraftdataError, OSError, ValueError) as e:
        notes.append(f"the export's tokenizer did not load ({e}): quality examples show ids")
        return
    if pin.sha256 and tok.sha256 != pin.sha256:
        notes.append(
            f"{pin.path} is not the tokenizer the export pins (sha256 {tok.sha256[:16]}…, "
            f"manifest says {pin.sha256[:16]}…): quality examples show ids"
        )
        return
    for t in tokens.values():
        for check, exs in t.examples.items():
            t.examples[check] = [
                QualityExample(e.id, e.tail_ids, tok.decode(e.tail_ids)[-EXAMPLE_CHARS:])
                for e in exs
            ]


def _contamination(led: Ledger, names: list[str]) -> dict[str, Tally]:
    out = {}
    for name in names:
        kept = led.meta.get(CONTAMINATION.of(name))
        if kept is not None:
            out[name] = Tally.of_record(kept)
    return out


def _manifest_datasets(cfg: Any) -> list[str]:
    ds = cfg.get("datasets") if isinstance(cfg, dict) else None
    if isinstance(ds, dict):
        return [str(k) for k in ds]
    if isinstance(ds, list):
        return [str(d["name"]) for d in ds if isinstance(d, dict) and "name" in d]
    return []


def read_ledger(run_dir: Path) -> LedgerFigures | None:
    path = run_dir / "ledger.sqlite"
    if not path.is_file():
        return None
    try:
        led = Ledger.read(path)
        try:
            with reading(path):  # a damaged page the open did not touch
                per = {name: throughput(led, name) for name in work_datasets(led)}
                cfg, argv = led.meta.get(MANIFEST), led.meta.get(COMMAND_LINE)
                names = list(dict.fromkeys([*per, *_manifest_datasets(cfg)]))
                return LedgerFigures(
                    per,
                    throughput(led, None),
                    cfg,
                    argv,
                    _contamination(led, names),
                )
        finally:
            led.close()
    except LedgerError as e:
        raise InputError(
            f"{e}; point the report at the run folder that `draftdata generate` wrote"
        ) from e


def load_preview(run_dir: Path, notes: list[str]) -> Preview | None:
    try:
        return read_preview(run_dir / "export")
    except (OSError, ValueError) as e:
        notes.append(
            f"export/{PREVIEW_FILE} is unreadable ({e}): no sample viewer; re-run "
            f"`draftdata export {run_dir}`"
        )
        return None


def _fingerprint(run_dir: Path) -> tuple[tuple[str, int, int], ...]:
    files = [run_dir / "export" / "manifest.json", run_dir / "export" / PREVIEW_FILE]
    files += [run_dir / "ledger.sqlite", run_dir / "scores.json"]
    files += [run_dir / "ledger.sqlite-wal", *sorted((run_dir / "export").glob("**/*.parquet"))]
    files += sorted((run_dir / ACCEPTANCE_DIR).glob("*.json"))
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
    export, manifest = read_export_record(run_dir)
    notes: list[str] = []
    tokens = scan_shards(run_dir, export, notes)
    decode_examples(tokens, export, notes)
    led = read_ledger(run_dir)
    if led is None:
        notes.append("ledger.sqlite not found in the run folder: no throughput or error figures")
    names = list(export.datasets)
    names += sorted(set(tokens) - set(names))
    for name in names:
        listed = export.datasets.get(name)
        want = listed.samples if listed is not None else None
        have = tokens.get(name, DatasetTokens()).rows
        if want is not None and want != have:
            notes.append(
                f"dataset {name}: the shards hold {have:,} samples, manifest says {want:,}"
            )
    return ReportData(
        run_dir,
        manifest,
        names,
        tokens,
        led.per_dataset if led else None,
        led.total if led else None,
        notes,
        preview=load_preview(run_dir, notes),
        run_manifest=led.run_manifest if led else None,
        command_line=led.command_line if led else None,
        scores=load_scores(run_dir, notes),
        export=export,
        contamination=led.contamination if led else {},
        acceptance=load_acceptance(run_dir, notes),
    )


def load_acceptance(run_dir: Path, notes: list[str]) -> list[Acceptance]:
    """Every drafter measured on the run, oldest first; an unreadable file is a note."""
    out = []
    for path in sorted((run_dir / ACCEPTANCE_DIR).glob("*.json")):
        try:
            out.append(Acceptance.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            notes.append(f"{ACCEPTANCE_DIR}/{path.name} is unreadable ({e}): not shown")
    return sorted(out, key=lambda a: (a.created_at, a.method, a.k))


def load_scores(run_dir: Path, notes: list[str]) -> dict[str, Any] | None:
    path = run_dir / "scores.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        notes.append(f"{path.name} is unreadable ({e}): no model scores shown")
        return None
    return doc if isinstance(doc, dict) else None
