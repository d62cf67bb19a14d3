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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ..errors import InputError
from ..model.flags import ScoreReport
from ..records import Flag, SampleScore
from .items import Item, iter_items
from .layers import n_layers_in, parse_layers
from .run import CHUNK, Pass, manifest

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
) -> dict[str, Any]:
    ray = _ray()
    from ..model.folders import import_torch_transformers
    from ..model.load import model_folder
    from .layouts import make_layout

    t0 = time.monotonic()
    ids = _ids_of(files)
    index = {x: i for i, x in enumerate(ids)}
    if len(index) != len(ids):
        raise InputError("the samples' ids repeat; Ray capture numbers samples by their id")
    torch, _ = import_torch_transformers()
    folder, _g = model_folder(model)  # a GGUF is converted here once, not by every actor
    chosen = parse_layers(layers_spec, n_layers_in(folder))  # a bad --layers fails here, at once
    control = sorted(control_ids)
    out.mkdir(parents=True, exist_ok=True)
    driver_layout = make_layout(layout, out, torch, dtype, codec)
    driver_layout.prepare(iter_items(files))
    started_here = False
    if not ray.is_initialized():
        if address == "local":
            ray.init(
                # the actors' CPUs, and one for the tasks that read the shards (without it the
                # actors hold every CPU and the reads never run)
                num_cpus=round(actors * cpus_per_actor) + 1,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
            )
        else:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        started_here = True
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        paths = [str(f) for f in files]
        # enough blocks that every actor has work from the start
        blocks = max(1, min(len(ids) // max(1, batch_rows // 4), actors * 4))
        if files[0].suffix == ".parquet":
            names = pq.ParquetFile(files[0]).schema_arrow.names
            cols = [
                c for c in ("id", "input_ids", "loss_mask", "dataset", "token_source") if c in names
            ]
            ds = ray.data.read_parquet(paths, columns=cols, override_num_blocks=blocks)
        else:
            ds = ray.data.read_json(paths, override_num_blocks=blocks)
        cfg = {
            "model": model,
            "device": device,
            "layers": layers_spec,
            "out": str(out),
            "layout": layout,
            "dtype": dtype,
            "codec": codec,
            "threshold": threshold,
            "control_ids": control,
            "index": index,
            "cpus_per_actor": cpus_per_actor,
        }
        res = ds.map_batches(
            CaptureActor,
            fn_constructor_args=(cfg,),
            batch_size=batch_rows,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=cpus_per_actor,
            num_gpus=gpus_per_actor,
            max_restarts=0,  # a failed replica fails the run, with its error
        )
        counts = {
            "samples": 0,
            "captured": 0,
            "resumed": 0,
            "tokens_captured": 0,
            "bytes_written": 0,
        }
        err_sq = ref_sq = 0.0
        sums: dict[str, str] = {}
        report = ScoreReport(threshold)
        for row in res.iter_rows():
            st = json.loads(row["stats"])
            err_sq += st.pop("err_sq")
            ref_sq += st.pop("ref_sq")
            sums.update(st.pop("sha256"))
            for k in counts:
                counts[k] += st[k]
            for d in json.loads(row["scores"]):
                report.add(_score(d))
    finally:
        if started_here:
            ray.shutdown()
    # the merged manifest (and, for draftdata's shards, the index of every actor's shards)
    merged = make_layout(layout, out, torch, dtype, codec)
    merged.bind(str(folder), chosen, files)  # what the trainer's settings name
    merged.sums.update(sums)  # draftdata's shards: the driver reads each shard's digest itself
    files_doc = merged.close()
    enc = merged.enc
    enc.err_sq, enc.ref_sq = err_sq, ref_sq
    from ..model.load import check_device, check_dtype

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
        counts,
        report,
        files,
        time.monotonic() - t0,
        ray={
            "address": address,
            "actors": actors,
            "gpus_per_actor": gpus_per_actor,
            "cpus_per_actor": cpus_per_actor,
        },
    )
