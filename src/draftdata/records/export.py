"""An export's ``manifest.json`` as a record: what the shards hold, what made them, and the run's
figures. ``ExportManifest.to_json`` writes the file's document and ``from_json`` reads it back
(an older or hand-written manifest's missing fields read as their defaults); nothing else builds
or parses it.

The validation report and the gate stay the JSON their own stages wrote (``measure``): the
export copies them into its manifest as they are."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import Provenance, Sample

__all__ = [
    "LOADER",
    "DatasetExport",
    "ExportManifest",
    "FileEntry",
    "FormatPin",
    "ShardEntry",
    "TokenizerPin",
]

#: how a trainer loads the shards, written into every manifest
LOADER = "datasets.load_dataset('parquet', data_files='export/shard-*.parquet')"


def _dict(v: Any) -> dict[str, Any]:
    return dict(v) if isinstance(v, Mapping) else {}


def _counts(v: Any) -> dict[str, int]:
    return {str(k): int(n) for k, n in _dict(v).items()}


@dataclass(frozen=True)
class TokenizerPin:
    """The tokenizer the samples were made with: its file (None where the export's own
    tokenizer did not make them), its sha256 and its chat template's."""

    path: str | None
    sha256: str
    chat_template_sha256: str | None = None


@dataclass(frozen=True)
class FormatPin:
    name: str
    version: str


@dataclass(frozen=True)
class ShardEntry:
    path: str
    rows: int | None  # None: not listed (a hand-made manifest)
    bytes: int | None = None
    sha256: str | None = None


#: a top-level folder of many files (ModelOpt's one per sample) is listed in this file inside it,
#: ``sha256sum``'s format, and the manifest lists that file (``export.sealed``)
SUMS_FILE = "SHA256SUMS"


@dataclass(frozen=True)
class FileEntry:
    """A file of the export besides ``manifest.json``: its path in the folder, its size and
    sha256, and the trainer export (``export --as NAME``) that wrote it (None: the export's
    own shards and preview)."""

    path: str
    bytes: int
    sha256: str
    trainer: str | None = None


@dataclass(frozen=True)
class DatasetExport:
    """One dataset's entry: how it was configured and sampled, what the export holds of it
    (``samples``, ``token_sources``, ``finish_reasons``, ``warnings``: counted from the stream)
    and what was dropped on the way."""

    backend: str | None = None
    backend_kind: str | None = None
    ground_truth: bool = False
    source: str | None = None
    reader: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    sampling_overrides: dict[str, Any] = field(default_factory=dict)
    samples_per_prompt: int = 1
    turns: str = "all"
    samples: int = 0
    token_sources: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    read_drops: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0


@dataclass(frozen=True)
class ExportManifest:
    """``manifest.json`` of an export. ``tokenizer`` / ``format`` name the most common
    provenance of the samples (what the export was configured with where it holds none);
    ``provenance`` lists every one with its number of samples."""

    run: str
    tokenizer: TokenizerPin
    format: FormatPin
    draftdata_version: str = ""
    created_at: str = ""
    provenance: tuple[tuple[Provenance, int], ...] = ()
    datasets: dict[str, DatasetExport] = field(default_factory=dict)
    samples: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    validation: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    shards: tuple[ShardEntry, ...] = ()
    cost_usd: float | None = None
    loader: str = LOADER
    #: ``export --drop``: the filters asked for (quality checks, ``contaminated``), in order
    filters: tuple[str, ...] = ()
    #: samples each filter left out, by dataset (a sample counts under the first that fits)
    filtered: dict[str, dict[str, int]] = field(default_factory=dict)
    #: every file of the export besides this manifest, trainers' files included; empty in a
    #: manifest written before exports listed them
    files: tuple[FileEntry, ...] = ()

    def counted(self, samples: Iterable[Sample]) -> ExportManifest:
        """This manifest with its figures counted from ``samples`` (consumed once): each
        dataset's samples, token sources, finish reasons and warnings, the provenances, and
        the total drops of its datasets. A dataset not listed yet is added with its defaults;
        the pins become the most common provenance's (the tokenizer's path and template hash
        only where it is this manifest's tokenizer)."""
        per: dict[str, tuple[Counter[str], Counter[str], Counter[str]]] = {
            name: (Counter(), Counter(), Counter()) for name in self.datasets
        }
        made_by: Counter[Provenance] = Counter()
        for s in samples:
            sources, finishes, warnings = per.setdefault(
                s.dataset, (Counter(), Counter(), Counter())
            )
            sources[s.token_source] += 1
            finishes[s.finish_reason] += 1
            warnings.update(s.warnings)
            made_by[s.provenance] += 1
        return self.with_counts(per, made_by)

    def with_counts(
        self,
        per: Mapping[str, tuple[Counter[str], Counter[str], Counter[str]]],
        made_by: Counter[Provenance],
    ) -> ExportManifest:
        """The figures of ``counted`` from counts already taken: per dataset its token sources,
        finish reasons and warnings, and the samples' provenances."""
        datasets = {}
        drops: Counter[str] = Counter()
        for name, (sources, finishes, warnings) in per.items():
            d = self.datasets.get(name, DatasetExport())
            datasets[name] = replace(
                d,
                samples=sum(sources.values()),
                token_sources=dict(sources),
                finish_reasons=dict(finishes),
                warnings=dict(warnings),
            )
            drops.update(d.drops)
        tok, fmt = self.tokenizer, self.format
        if made_by:  # else nothing exported: the pins say what it was configured with
            common = made_by.most_common(1)[0][0]
            same = common.tokenizer_sha256 == tok.sha256  # the path names the file that made them
            tok = TokenizerPin(
                tok.path if same else None,
                common.tokenizer_sha256,
                tok.chat_template_sha256 if same else None,
            )
            fmt = FormatPin(common.format_name, common.format_version)
        return replace(
            self,
            tokenizer=tok,
            format=fmt,
            provenance=tuple(made_by.most_common()),
            datasets=datasets,
            samples=sum(d.samples for d in datasets.values()),
            drops=dict(drops),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "draftdata_version": self.draftdata_version,
            "run": self.run,
            "created_at": self.created_at,
            "tokenizer": {
                "path": self.tokenizer.path,
                "sha256": self.tokenizer.sha256,
                "chat_template_sha256": self.tokenizer.chat_template_sha256,
            },
            "format": {"name": self.format.name, "version": self.format.version},
            "provenance": [
                {
                    "tokenizer_sha256": p.tokenizer_sha256,
                    "format_name": p.format_name,
                    "format_version": p.format_version,
                    "draftdata_version": p.draftdata_version,
                    "samples": n,
                }
                for p, n in self.provenance
            ],
            "datasets": {
                name: {
                    "backend": d.backend,
                    "backend_kind": d.backend_kind,
                    "ground_truth": d.ground_truth,
                    "source": d.source,
                    "reader": d.reader,
                    "sampling": d.sampling,
                    "sampling_overrides": d.sampling_overrides,
                    "samples_per_prompt": d.samples_per_prompt,
                    "turns": d.turns,
                    "samples": d.samples,
                    "token_sources": d.token_sources,
                    "finish_reasons": d.finish_reasons,
                    "warnings": d.warnings,
                    "drops": d.drops,
                    "read_drops": d.read_drops,
                    "cost_usd": d.cost_usd,
                }
                for name, d in self.datasets.items()
            },
            "counts": {"samples": self.samples, "drops": self.drops},
            "validation": self.validation,
            "gate": self.gate,
            "shards": [
                {"path": s.path, "rows": s.rows, "bytes": s.bytes, "sha256": s.sha256}
                for s in self.shards
            ],
            "cost_usd": self.cost_usd,
            "loader": self.loader,
            "filters": list(self.filters),
            "filtered": {k: dict(v) for k, v in self.filtered.items()},
            "files": [
                {"path": f.path, "bytes": f.bytes, "sha256": f.sha256, "trainer": f.trainer}
                for f in self.files
            ],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExportManifest:
        """Raises ValueError (or KeyError / TypeError) where ``d`` is not an export manifest:
        no ``datasets`` object, or a field of the wrong kind."""
        if not isinstance(d, Mapping) or not isinstance(d.get("datasets"), Mapping):
            raise ValueError("no 'datasets' object")
        tok, fmt, counts = _dict(d.get("tokenizer")), _dict(d.get("format")), _dict(d.get("counts"))
        datasets = {}
        for name, v in d["datasets"].items():
            e = _dict(v)
            datasets[str(name)] = DatasetExport(
                backend=e.get("backend"),
                backend_kind=e.get("backend_kind"),
                ground_truth=bool(e.get("ground_truth", False)),
                source=e.get("source"),
                reader=e.get("reader"),
                sampling=_dict(e.get("sampling")),
                sampling_overrides=_dict(e.get("sampling_overrides")),
                samples_per_prompt=int(e.get("samples_per_prompt", 1)),
                turns=str(e.get("turns", "all")),
                samples=int(e.get("samples") or 0),
                token_sources=_counts(e.get("token_sources")),
                finish_reasons=_counts(e.get("finish_reasons")),
                warnings=_counts(e.get("warnings")),
                drops=_counts(e.get("drops")),
                read_drops=_counts(e.get("read_drops")),
                cost_usd=float(e.get("cost_usd") or 0.0),
            )
        validation, gate, cost = d.get("validation"), d.get("gate"), d.get("cost_usd")
        return cls(
            run=str(d.get("run", "")),
            tokenizer=TokenizerPin(
                tok.get("path"), str(tok.get("sha256", "")), tok.get("chat_template_sha256")
            ),
            format=FormatPin(str(fmt.get("name", "")), str(fmt.get("version", ""))),
            draftdata_version=str(d.get("draftdata_version", "")),
            created_at=str(d.get("created_at", "")),
            provenance=tuple(
                (
                    Provenance(
                        str(p["tokenizer_sha256"]),
                        str(p["format_name"]),
                        str(p["format_version"]),
                        str(p["draftdata_version"]),
                    ),
                    int(p["samples"]),
                )
                for p in d.get("provenance") or ()
            ),
            datasets=datasets,
            samples=int(counts.get("samples") or 0),
            drops=_counts(counts.get("drops")),
            validation=dict(validation) if isinstance(validation, Mapping) else None,
            gate=dict(gate) if isinstance(gate, Mapping) else None,
            shards=tuple(
                ShardEntry(
                    str(s["path"]),
                    int(s["rows"]) if s.get("rows") is not None else None,
                    s.get("bytes") if isinstance(s.get("bytes"), int) else None,
                    s.get("sha256"),
                )
                for s in d.get("shards") or ()
            ),
            cost_usd=None if cost is None else float(cost),
            loader=str(d.get("loader", LOADER)),
            filters=tuple(str(f) for f in d.get("filters") or ()),
            filtered={str(k): _counts(v) for k, v in _dict(d.get("filtered")).items()},
            files=tuple(
                FileEntry(
                    str(f["path"]),
                    int(f["bytes"]),
                    str(f["sha256"]),
                    None if f.get("trainer") is None else str(f["trainer"]),
                )
                for f in d.get("files") or ()
            ),
        )
