"""``draftdata hidden-states --ray``: the same capture, data-parallel on a Ray cluster.

The driver writes what is shared (the speculators dataset of ids) and numbers the samples as the
single-process path does (the ``i``-th row across the input files in name order). The shards are
read with ``ray.data.read_parquet``; ``map_batches`` runs the capture on a pool of actors, one model
replica each (``--gpus-per-actor`` GPUs; a model that needs several GPUs is split over the
actor's GPUs by transformers' ``device_map``), and every actor writes its samples' files
directly, in the same layout and under the same names. Each batch hands back only its counts and
scores, which the driver merges into the manifest.

Ray is an optional extra (``pip install 'draftdata[ray]'``). ``--ray local`` starts a cluster in
this process, sized to the actors; ``--ray auto`` or an address joins a running one."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ..errors import InputError
from ..model.flags import ScoreReport
from ..records import Flag, SampleScore
from .export_capture import CHUNK, Pass, manifest
from .items import Item, iter_items
from .layers import n_layers_in, parse_layers

__all__ = ["capture_ray"]


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError as e:
        raise InputError(
            "--ray needs Ray Data; install it with pip install 'draftdata[ray]'"
        ) from e
    return ray


def _ids_of(files: list[Path]) -> list[str]:
    ids: list[str] = []
    for f in files:
        if f.suffix == ".parquet":
            col = pq.read_table(f, columns=["id"]).column("id").to_pylist()
            ids += [str(x) for x in col]
        else:
            ids += [it.id for it in iter_items([f])]
    return ids


class CaptureActor:
    """One model replica: captures a batch of rows and writes their files."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        from ..model.load import load_causal_lm
        from .capture import n_layers_of

        threads = max(1, int(cfg["cpus_per_actor"])) if cfg["device"] == "cpu" else None
        lm = load_causal_lm(cfg["model"], device=cfg["device"], threads=threads)
        layers = parse_layers(cfg["layers"], n_layers_of(lm))
        self.index: dict[str, int] = cfg["index"]
        self.p = Pass(
            lm,
            layers,
            Path(cfg["out"]),
            cfg["layout"],
            cfg["dtype"],
            frozenset(cfg["control_ids"]),
            cfg["threshold"],
            cfg["codec"],
            cfg["options"],
        )

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        n = len(batch["id"])
        items = [
            Item(
                self.index[str(batch["id"][k])],
                str(batch["id"][k]),
                [int(t) for t in batch["input_ids"][k]],
                [bool(b) for b in batch["loss_mask"][k]],
                str(batch["dataset"][k]) if "dataset" in batch else "",
                str(batch["token_source"][k]) if "token_source" in batch else "",
            )
            for k in range(n)
        ]
        before = self.p.counts()
        enc = self.p.layout.enc
        err0, ref0 = enc.err_sq, enc.ref_sq
        sums = self.p.layout.sums
        sums.clear()
        scores = self.p.chunk(items)
        self.p.flush()  # every file of the batch (an actor's shard too) before it counts as done
        after = self.p.counts()
        delta = {k: after[k] - before[k] for k in after}
        stats = {**delta, "err_sq": enc.err_sq - err0, "ref_sq": enc.ref_sq - ref0}
        return {
            # the digests of the batch's files, for the manifest the driver writes
            "stats": [json.dumps({**stats, "sha256": dict(sums)})],
            "scores": [json.dumps([asdict(s) for s in scores])],
        }


def _score(d: dict[str, Any]) -> SampleScore:
    flags = tuple(Flag(**f) for f in d.pop("flags"))
    return SampleScore(**d, flags=flags)


#: the counts each batch hands back, merged into the manifest in this order
COUNTS = ("samples", "captured", "resumed", "tokens_captured", "bytes_written")


@dataclass(frozen=True)
class Cluster:
    """Where the capture runs: the Ray cluster (``local``, ``auto`` or an address) and its pool
    of actors, each with its share of GPUs and CPUs and ``batch_rows`` rows a batch."""

    address: str
    actors: int
    gpus_per_actor: float
    cpus_per_actor: float
    batch_rows: int

    def doc(self) -> dict[str, Any]:
        """What the manifest records of the cluster."""
        return {
            "address": self.address,
            "actors": self.actors,
            "gpus_per_actor": self.gpus_per_actor,
            "cpus_per_actor": self.cpus_per_actor,
        }


@dataclass
class Totals:
    """What the batches handed back, added up: the counts, the encoder's error sums, the digests
    of the files the actors wrote, and the samples' scores."""

    report: ScoreReport
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    err_sq: float = 0.0
    ref_sq: float = 0.0
    sums: dict[str, str] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        """Adds one batch's row: its counts, error sums, file digests and scores."""
        st = json.loads(row["stats"])
        self.err_sq += st.pop("err_sq")
        self.ref_sq += st.pop("ref_sq")
        self.sums.update(st.pop("sha256"))
        for k in self.counts:
            self.counts[k] += st[k]
        for d in json.loads(row["scores"]):
            self.report.add(_score(d))


def capture_ray(
    files: list[Path],
    out: Path,
    model: str,
    *,
    layers_spec: str,
    layout: str,
    dtype: str,
    device: str,
    threshold: float,
    control_ids: frozenset[int],
    address: str,
    actors: int,
    gpus_per_actor: float,
    cpus_per_actor: float,
    batch_rows: int = CHUNK,
    codec: str = "none",
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    ray = _ray()
    from ..model.folders import import_torch_transformers
    from ..model.load import check_device, check_dtype, model_folder
    from .identity import claim, identity
    from .layouts import make_layout

    t0 = time.monotonic()
    cluster = Cluster(address, actors, gpus_per_actor, cpus_per_actor, batch_rows)
    ids = _ids_of(files)
    index = {x: i for i, x in enumerate(ids)}
    if len(index) != len(ids):
        raise InputError("the samples' ids repeat; Ray capture numbers samples by their id")
    torch, _ = import_torch_transformers()
    folder, _g = model_folder(model)  # a GGUF is converted here once, not by every actor
    chosen = parse_layers(layers_spec, n_layers_in(folder))  # a bad --layers fails here, at once
    first = make_layout(layout, out, torch, dtype, codec, options)
    first.bind(str(folder), chosen, files)  # its options checked before anything is recorded
    ident = identity(layout, dtype, codec, chosen, folder, options)
    claim(out, ident)  # before any actor writes: a folder holds one capture
    first.prepare(iter_items(files))
    cfg = {
        "model": model,
        "device": device,
        "layers": layers_spec,
        "out": str(out),
        "layout": layout,
        "dtype": dtype,
        "codec": codec,
        "threshold": threshold,
        "control_ids": sorted(control_ids),
        "index": index,
        "cpus_per_actor": cpus_per_actor,
        "options": options,
    }
    totals = _run_on_cluster(ray, cluster, files, len(ids), cfg, ScoreReport(threshold))
    # the merged manifest (and, for draftdata's shards, the index of every actor's shards)
    merged = make_layout(layout, out, torch, dtype, codec, options)
    merged.bind(str(folder), chosen, files)  # what the trainer's settings name
    # draftdata's shards: the driver reads each shard's digest itself
    merged.sums.update(totals.sums)
    files_doc = merged.close()
    enc = merged.enc
    enc.err_sq, enc.ref_sq = totals.err_sq, totals.ref_sq
    dev = check_device(torch, device)
    return manifest(
        out,
        model,
        check_dtype("float32" if dev == "cpu" else "bfloat16", dev),
        dev,
        chosen,
        layout,
        files_doc,
        enc.report(),
        totals.counts,
        totals.report,
        files,
        time.monotonic() - t0,
        ray=cluster.doc(),
        capture=ident,
    )


def _run_on_cluster(
    ray: Any,
    cluster: Cluster,
    files: list[Path],
    n_rows: int,
    cfg: dict[str, Any],
    report: ScoreReport,
) -> Totals:
    """Runs the capture on the cluster's actors, each built from ``cfg``, and merges what
    every batch hands back. A cluster started here is shut down after, whatever happens."""
    started_here = _start(ray, cluster)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        res = _read(ray, cluster, files, n_rows).map_batches(
            CaptureActor,
            fn_constructor_args=(cfg,),
            batch_size=cluster.batch_rows,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=cluster.actors),
            num_cpus=cluster.cpus_per_actor,
            num_gpus=cluster.gpus_per_actor,
            max_restarts=0,  # a failed replica fails the run, with its error
        )
        totals = Totals(report)
        for row in res.iter_rows():
            totals.add(row)
        return totals
    finally:
        if started_here:
            ray.shutdown()


def _start(ray: Any, cluster: Cluster) -> bool:
    """Starts or joins the cluster unless this process already has one; whether it did."""
    if ray.is_initialized():
        return False
    if cluster.address == "local":
        ray.init(
            # the actors' CPUs, and one for the tasks that read the shards (without it the
            # actors hold every CPU and the reads never run)
            num_cpus=round(cluster.actors * cluster.cpus_per_actor) + 1,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
        )
    else:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    return True


def _read(ray: Any, cluster: Cluster, files: list[Path], n_rows: int) -> Any:
    """The samples as a Ray dataset, in enough blocks that every actor has work from the
    start; of Parquet shards only the columns the capture reads."""
    paths = [str(f) for f in files]
    blocks = max(1, min(n_rows // max(1, cluster.batch_rows // 4), cluster.actors * 4))
    if files[0].suffix == ".parquet":
        names = pq.ParquetFile(files[0]).schema_arrow.names
        cols = [
            c for c in ("id", "input_ids", "loss_mask", "dataset", "token_source") if c in names
        ]
        return ray.data.read_parquet(paths, columns=cols, override_num_blocks=blocks)
    return ray.data.read_json(paths, override_num_blocks=blocks)
