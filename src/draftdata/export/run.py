"""A run's export: Parquet shards and manifest.json from the ledger's samples, written into a
new folder and swapped in whole (``RUN/export`` is a symlink to it; see ``shards.publish``).

Samples are read back with the provenance they were made under. Answers the tokens stage has not
decided yet (a ledger migrated from an older schema, or a run stopped between generation and
the tokens stage) go through it first; samples already made are never made again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..measure.gate import Gate, is_ground_truth
from ..records import Provenance
from ..store.stats import status
from .preview import write_preview
from .shards import ShardWriter, now_iso, publish, shard_row, staging_folder, write_json

if TYPE_CHECKING:
    from ..generate.runner import Runner
    from ..manifest import DatasetCfg

LOADER = "datasets.load_dataset('parquet', data_files='export/shard-*.parquet')"

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


def export_run(
    runner: Runner,
    validation: dict[str, Any] | None,
    gate: Gate | None,
    shard_bytes: int | None = None,
) -> Path:
    """Write RUN/export/shard-*.parquet and RUN/export/manifest.json; returns the folder."""
    m, led = runner.m, runner.ledger
    for d in m.datasets:
        runner.make_samples(d, only_missing=True)
    folder = staging_folder(m.output_dir)  # the old export stays whole until the swap
    writer = ShardWriter(folder, **({"max_bytes": shard_bytes} if shard_bytes else {}))
    st = status(led)
    datasets: dict[str, Any] = {}
    totals: Counter[str] = Counter()
    made_by: Counter[Provenance] = Counter()
    n_samples = 0
    for d in m.datasets:
        sources: Counter[str] = Counter()
        finishes: Counter[str] = Counter()
        warnings: Counter[str] = Counter()
        n = 0
        for s, meta in led.samples_with_metadata(d.name):  # streamed: one row at a time
            writer.add(shard_row(s, meta))
            sources[s.token_source] += 1
            finishes[s.finish_reason] += 1
            warnings.update(s.warnings)
            made_by[s.provenance] += 1
            n += 1
        ds = st.dataset(d.name)
        drops = dict(ds.drops)
        if ds.failed:
            drops["generation_failed"] = ds.failed
        totals.update(drops)
        n_samples += n
        backend = m.backends[d.backend]
        sampling, overrides = sampling_of(d, backend)
        datasets[d.name] = {
            "backend": d.backend,
            "backend_kind": backend.kind,
            "ground_truth": is_ground_truth(m, d),
            "source": d.source,
            "reader": d.reader,
            "sampling": sampling,
            "sampling_overrides": overrides,
            "samples_per_prompt": d.samples_per_prompt,
            "turns": d.turns,
            "samples": n,
            "token_sources": dict(sources),
            "finish_reasons": dict(finishes),
            "warnings": dict(warnings),
            "drops": drops,
            "read_drops": led.get_meta(f"read_drops:{d.name}", {}),
            "cost_usd": ds.cost_usd,
        }
    shards = writer.close()
    doc = {
        "draftdata_version": __version__,
        "run": m.run.name,
        "created_at": now_iso(),
        **provenance_fields(runner, made_by),
        "datasets": datasets,
        "counts": {"samples": n_samples, "drops": dict(totals)},
        "validation": validation,
        "gate": gate.to_json() if gate is not None else led.get_meta("gate"),
        "shards": shards,
        "cost_usd": st.cost_usd,
        "loader": LOADER,
    }
    write_preview(runner, folder)
    write_json(folder / "manifest.json", doc)
    return publish(m.output_dir, folder)


def provenance_fields(runner: Runner, made_by: Counter[Provenance]) -> dict[str, Any]:
    """What made the samples, from the samples themselves. One provenance is the normal case;
    where a run holds samples made under several, each is listed with its count and the
    top-level tokenizer and format name the most common one."""
    tok = runner.bound.tokenizer
    if not made_by:  # nothing exported: say what this export was configured with
        fmt = runner.bound.format
        common = Provenance(tok.sha256, fmt.name, fmt.version, __version__)
    else:
        common = made_by.most_common(1)[0][0]
    same = tok.sha256 == common.tokenizer_sha256  # the path names the file only if it made them
    doc: dict[str, Any] = {
        "tokenizer": {
            "path": str(tok.path) if same else None,
            "sha256": common.tokenizer_sha256,
            "chat_template_sha256": tok.chat_template_sha256 if same else None,
        },
        "format": {"name": common.format_name, "version": common.format_version},
        "provenance": [
            {
                "tokenizer_sha256": p.tokenizer_sha256,
                "format_name": p.format_name,
                "format_version": p.format_version,
                "draftdata_version": p.draftdata_version,
                "samples": n,
            }
            for p, n in made_by.most_common()
        ],
    }
    return doc
