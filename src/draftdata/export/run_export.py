"""A run's export: the run's samples streamed from its ledger into ``write.write_export``
(Parquet shards, manifest.json, preview.json) in a new folder, swapped in whole (``RUN/export``
is a symlink to it; see ``shards.publish``); and the trainers' files beside it (``export_as``).

This module is where a run meets the export: its functions take what they read (the run's
ledger, its manifest, the bound format), never the generation ``Runner``, and the writers take
streams of samples and an ``ExportManifest``. Samples are read back with the provenance they were made
under. Answers the tokens stage has not decided yet (a ledger migrated from an older schema, or a
run stopped between generation and the tokens stage) go through it first; samples already made
are never made again."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..measure.gate import Gate
from ..measure.validate import ValidationReport
from ..records import Answered, Sample
from ..records.export import DatasetExport, ExportManifest, FormatPin, TokenizerPin
from ..store.meta import GATE, READ_DROPS, gate_json
from ..store.stats import status
from ..tokens.run_samples import RunTokens
from ..version import __version__
from .filters import CONTAMINATED, SampleFilter
from .sealed import restage, seal
from .shards import publish, staging_folder
from .trainers import EXPORTERS
from .trainers.specforge import rendered_system
from .write import read_export_manifest, write_export

if TYPE_CHECKING:
    from rich.console import Console

    from ..config import DatasetCfg, Manifest
    from ..formats import BoundFormat
    from ..store.ledger import Ledger
    from ..tokens.checks import RunChecks
    from ..tokens.target import Target

#: request fields that decide what is sampled or where it stops: set in a backend's
#: ``extra_body``, they override the dataset's sampling table (extra_body is merged into the
#: request body last) or add to it
SAMPLING_FIELDS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "seed",
        "max_completion_tokens",
        "top_k",
        "min_p",
        "typical_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "length_penalty",
        "logit_bias",
        "min_tokens",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "n",
        "best_of",
        "use_beam_search",
    }
)


def sampling_of(d: DatasetCfg, backend: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sampling the requests carried and the ``extra_body`` fields that set it: the
    dataset's table, with what the backend's extra_body overrides in its place, so the export
    never claims sampling the requests did not use. (A seed set there is sent as is, the same
    for every request, instead of the per-sample seeds drawn from the table's.)"""
    extra = getattr(backend, "extra_body", None) or {}
    overrides = {k: v for k, v in extra.items() if k in SAMPLING_FIELDS}
    table = d.sampling.model_dump()
    return {**table, **{k: v for k, v in overrides.items() if k in table}}, overrides


class RunSamples:
    """A run's samples in export order: dataset by dataset (in the order given), each in key
    order, streamed from the ledger one row at a time. Each pass reads the ledger again.
    ``metadata(s)`` is the prompt metadata of ``s``, the sample last yielded: it is read in the
    same row (with ``with_metadata``), so no dataset's prompts are held."""

    def __init__(self, ledger: Ledger, datasets: Sequence[str], with_metadata: bool = False):
        self.ledger, self.datasets, self.with_metadata = ledger, tuple(datasets), with_metadata
        self._last: tuple[Sample, dict[str, Any]] | None = None

    def __iter__(self) -> Iterator[Sample]:
        for name in self.datasets:
            for s, meta in self.ledger.samples.with_metadata(name, metadata=self.with_metadata):
                self._last = (s, meta)
                yield s

    def metadata(self, s: Sample) -> dict[str, Any]:
        if self._last is None or self._last[0] is not s:
            raise ValueError(f"sample {s.id}: its metadata is known only as it is yielded")
        return self._last[1]


@dataclass
class StoredValidation(ValidationReport):
    """``RUN/validation.json`` as the run wrote it, for an export made later (``draftdata
    export``): the manifest copies its document unchanged (a report rebuilt from its rates
    would not be the one the gate saw)."""

    stored: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.stored)

    @classmethod
    def read(cls, path: Path) -> StoredValidation | None:
        if not path.exists():
            return None
        doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return cls(n=int(doc.get("n") or 0), exact=int(doc.get("exact") or 0), stored=doc)


def run_manifest(
    ledger: Ledger,
    m: Manifest,
    bound: BoundFormat,
    validation: ValidationReport | None,
    gate: Gate | None,
) -> ExportManifest:
    """What the run's export manifest says before its samples are counted: the run, each
    dataset's settings, drops and cost, the validation, the gate, the tokenizer and format the
    run is configured with."""
    led = ledger
    st = status(led)
    datasets: dict[str, DatasetExport] = {}
    for d in m.datasets:
        ds = st.dataset(d.name)
        drops = dict(ds.drops)
        if ds.failed:
            drops["generation_failed"] = ds.failed
        backend = m.backends[d.backend]
        sampling, overrides = sampling_of(d, backend)
        datasets[d.name] = DatasetExport(
            backend=d.backend,
            backend_kind=backend.kind,
            ground_truth=m.is_ground_truth(d),
            source=d.source,
            reader=d.reader,
            sampling=sampling,
            sampling_overrides=overrides,
            samples_per_prompt=d.samples_per_prompt,
            turns=d.turns,
            drops=drops,
            read_drops=led.meta.get(READ_DROPS.of(d.name), {}),
            cost_usd=ds.cost_usd,
        )
    tok, fmt = bound.tokenizer, bound.format
    kept = led.meta.get(GATE) if gate is None else None  # the gate the run decided
    return ExportManifest(
        run=m.run.name,
        tokenizer=TokenizerPin(str(tok.path), tok.sha256, tok.chat_template_sha256),
        format=FormatPin(fmt.name, fmt.version),
        draftdata_version=__version__,
        datasets=datasets,
        validation=validation.to_json() if validation is not None else None,
        gate=gate.to_json() if gate is not None else gate_json(kept) if kept else None,
        cost_usd=st.cost_usd,
    )


def contaminated_prompts(ledger: Ledger, m: Manifest) -> frozenset[tuple[str, str]]:
    """The (dataset, prompt id) of every prompt of the run that holds an evaluation prompt: of
    the manifest's ``[run] decontaminate`` sets, or of every built-in set where it names none."""
    from ..measure.contamination import BUILTIN_SETS, detector_for

    det = detector_for(m.run.decontaminate or BUILTIN_SETS, m.base_dir)
    return frozenset(
        (d.name, p.id) for d in m.datasets for p, _ in det.scan(ledger.prompts.of(d.name))
    )


def export_run(
    ledger: Ledger,
    m: Manifest,
    target: Target,
    validation: ValidationReport | None,
    gate: Gate | None,
    shard_bytes: int | None = None,
    drop: Sequence[str] = (),
    *,
    checks: RunChecks | None = None,
    console: Console | None = None,
    kinds: Sequence[str] = (),
) -> Path:
    """Write RUN/export/shard-*.parquet, manifest.json, preview.json and the files of each
    trainer export in ``kinds`` (``export --as``), all swapped in as one, the manifest listing
    every file with its size and sha256 (``sealed``); returns the folder.
    ``drop``: the filters (``export.filters``) whose samples are left out, recorded in the
    manifest with how many each took. Answers not decided yet go through the run's tokens
    stage first (``tokens.run_samples``) with the run's ``target`` (its split preferences
    included), its quality ``checks`` where the caller holds them, and ``console`` for its notes
    (None: quiet)."""
    bound = target.bound
    stage = RunTokens(ledger, m, target, checks=checks, console=console)
    for d in m.datasets:
        stage.make(d, only_missing=True)
    flt = _filter(ledger, m, drop)
    # the manifest holds the filter's counts, filled as the samples stream through it
    head = replace(
        run_manifest(ledger, m, bound, validation, gate), filters=tuple(drop), filtered=flt.filtered
    )
    folder = staging_folder(m.output_dir)  # the old export stays whole until the swap
    samples = RunSamples(ledger, [d.name for d in m.datasets], with_metadata=True)
    write_export(
        flt(samples) if drop else samples,
        folder,
        head,
        metadata=samples.metadata,
        tokenizer=bound.tokenizer,
        shard_bytes=shard_bytes,
    )
    seal(folder, {k: _write_as(ledger, m, bound, k, drop, folder) for k in kinds})
    return publish(m.output_dir, folder)


def run_conversations(
    ledger: Ledger, m: Manifest, bound: BoundFormat, drop: Sequence[str] = ()
) -> Iterator[Answered]:
    """The run's answered conversations that became samples (the others were dropped at the
    tokens stage: not training data) and pass ``drop``'s filters, dataset by dataset."""
    from ..tokens.target import Target

    flt = _filter(ledger, m, drop)
    stage = RunTokens(ledger, m, Target(bound))  # conversations only: nothing is encoded
    for d in m.datasets:
        have = {s.key for s in flt(ledger.samples.of(d.name))}
        yield from (a for a in stage.conversations(d) if a.key in have)


def _filter(ledger: Ledger, m: Manifest, drop: Sequence[str]) -> SampleFilter:
    hit = contaminated_prompts(ledger, m) if CONTAMINATED in drop else frozenset()
    return SampleFilter(drop, hit)


def export_as(
    ledger: Ledger, m: Manifest, bound: BoundFormat, name: str, drop: Sequence[str] = ()
) -> tuple[Path, ...]:
    """A trainer's files (``EXPORTERS[name]``) in the run's published export: the ones it was
    written with (``export_run(kinds=...)``), or else written now into a copy of it that is
    swapped in whole, from the run's samples (or, for a lossy export, its conversations) that
    pass ``drop``'s filters (the ones the export was written with)."""
    link = m.output_dir / "export"
    made = [f.path for f in read_export_manifest(link).files if f.trainer == name]
    if made:
        return tuple(sorted({link / p.split("/")[0] for p in made}))
    staged = restage(link, name)
    paths = _write_as(ledger, m, bound, name, drop, staged)
    seal(staged, {name: paths})
    publish(m.output_dir, staged)
    return tuple(link / p.relative_to(staged) for p in paths)


def _write_as(
    ledger: Ledger, m: Manifest, bound: BoundFormat, name: str, drop: Sequence[str], folder: Path
) -> tuple[Path, ...]:
    """The files of the trainer export ``name`` written into the export ``folder``."""
    e = EXPORTERS[name]
    if e.write_conversations is not None:
        system = rendered_system(bound.format)
        return e.write_conversations(run_conversations(ledger, m, bound, drop), folder, system)
    assert e.write is not None
    samples = RunSamples(ledger, [d.name for d in m.datasets])
    return e.write(_filter(ledger, m, drop)(samples), read_export_manifest(folder), folder)
