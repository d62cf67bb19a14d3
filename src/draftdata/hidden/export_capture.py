"""``draftdata hidden-states``: the capture over an export's samples, in the export's order.

The input is a run (its published export, ``RUN/export/shard-*.parquet``) or sample files
(``.parquet`` / ``.jsonl``, or a folder of them); sample ``i`` is the ``i``-th row across the
files in name order, and keeps that index in every layout. Rows are streamed: at most one chunk
of samples and its hidden states is held at a time (one shard for ``--for safetensors``).

The pass verifies what it captures: every sample's trained tokens are scored from the same logits
(flags below the threshold, as ``draftdata score`` does), and ids outside the model's vocabulary
or past its positions are refused before anything is written. ``draftdata-hidden-states.json``
says what was captured, with which layers (in every numbering), model and dtype, and the
verification."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

from ..model.flags import SampleScore, ScoreReport, score_of
from ..model.load import LoadedModel
from ..model.score import fits_model
from .capture import Capturer
from .codec import MANIFEST
from .engine import EngineCapturer, EngineTarget
from .identity import claim, identity
from .items import Item, input_files, iter_items
from .layers import Layers
from .layouts import make_layout

__all__ = ["MANIFEST", "Pass", "capture_to", "input_files", "iter_items", "manifest"]

#: samples read together (one or more batched passes)
CHUNK = 64
#: file writes in flight at once (each holds one sample's hidden states on the host)
PENDING = 16
WRITERS = 2


def check_item(lm: LoadedModel | EngineTarget, it: Item) -> None:
    fits_model(it.input_ids, lm.vocab_size, lm.max_positions, f"sample {it.id}", "capture")


class Pass:
    """The capture of one process: a layout, a capturer (the model in this process, or the
    engine behind a server), the verification and the counts."""

    def __init__(
        self,
        lm: LoadedModel | EngineTarget,
        layers: Layers,
        out: Path,
        layout: str,
        dtype: str,
        control_ids: Collection[int],
        threshold: float,
        codec: str = "none",
        options: dict[str, Any] | None = None,
        files: list[Path] | None = None,
    ) -> None:
        self.lm, self.layers, self.out = lm, layers, out
        self.layout = make_layout(layout, out, lm.torch, dtype, codec, options)
        engine = isinstance(lm, EngineTarget)  # the engine behind a server
        self.layout.bind(str(lm.folder), layers, files or [], None if engine else lm)
        # a folder holds one capture: another is refused before a file is written (and after
        # its options were checked, so that a refused option is never recorded)
        self.identity = identity(layout, dtype, codec, layers, lm.folder, options)
        claim(out, self.identity)
        self.cap: Capturer | EngineCapturer
        if isinstance(lm, EngineTarget):
            self.cap = lm.capturer_for(self.layout)
        else:
            self.cap = Capturer(lm, layers, keep_logits=self.layout.keep_logits)
        self.control_ids, self.threshold = control_ids, threshold
        self._pool = ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="hs-writer")
        self._pending: deque[Future[int]] = deque()
        self.n = self.resumed = self.captured = self.tokens = self.written = 0

    def chunk(self, chunk: list[Item]) -> list[SampleScore]:
        """Capture and write the samples of ``chunk`` that are not written yet; their scores."""
        todo = []
        for x in chunk:
            self.n += 1
            if self.layout.done(x):
                self.resumed += 1
            else:
                check_item(self.lm, x)
                todo.append(x)
        scores = []
        for i, c in self.cap.capture([x.input_ids for x in todo]):
            x = todo[i]
            self._submit(self.layout.write(x, c))
            scores.append(
                score_of(
                    x.id,
                    x.dataset,
                    x.token_source,
                    x.input_ids,
                    x.loss_mask,
                    c.logprobs,
                    self.control_ids,
                    self.threshold,
                )
            )
            self.captured += 1
            self.tokens += len(x.input_ids)
        return scores

    def _submit(self, job: Callable[[], int]) -> None:
        """Run a file write on the writer threads; at most ``PENDING`` wait (host memory)."""
        while len(self._pending) >= PENDING:
            self.written += self._pending.popleft().result()
        self._pending.append(self._pool.submit(job))

    def flush(self) -> None:
        """Every file so far written: the pending shard of draftdata's layout too."""
        take = getattr(self.layout, "take", None)
        if take is not None:
            self._submit(take())
        while self._pending:
            self.written += self._pending.popleft().result()

    def close(self) -> dict[str, Any]:
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)
            self.cap.close()
        return dict(self.layout.close())

    def counts(self) -> dict[str, int]:
        return {
            "samples": self.n,
            "captured": self.captured,
            "resumed": self.resumed,
            "tokens_captured": self.tokens,
            "bytes_written": self.written,
        }


def manifest(
    out: Path,
    lm_spec: str,
    lm_dtype: str,
    device: str,
    layers: Layers,
    layout: str,
    files_doc: dict[str, Any],
    enc_doc: dict[str, Any],
    counts: dict[str, int],
    report: ScoreReport,
    files: list[Path],
    seconds: float,
    **extra: Any,
) -> dict[str, Any]:
    """The capture's manifest, written to ``out/draftdata-hidden-states.json``."""
    from ..files import write_json

    tokens = counts["tokens_captured"]
    doc: dict[str, Any] = {
        "kind": "draftdata.hidden_states",
        "layout": layout,
        **files_doc,
        "model": lm_spec,
        "model_dtype": lm_dtype,
        "device": device,
        "layers": layers.to_json(),
        **enc_doc,
        **counts,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
        "inputs": [str(f) for f in files],
        **extra,
        "verify": report.to_json(),
    }
    write_json(out / MANIFEST, doc)
    return doc


def capture_to(
    files: list[Path],
    out: Path,
    lm: LoadedModel | EngineTarget,
    layers: Layers,
    *,
    layout: str = "speculators",
    dtype: str = "bf16",
    codec: str = "none",
    control_ids: Collection[int] = (),
    threshold: float = -12.0,
    progress: Callable[[int, int], None] | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Capture every sample of ``files`` into ``out`` in one process; the manifest. ``options``:
    the layout's own (``--top-k`` ... for NeMo Automodel's cache)."""
    t0 = time.monotonic()
    p = Pass(lm, layers, out, layout, dtype, control_ids, threshold, codec, options, files)
    report = ScoreReport(threshold)
    try:
        p.layout.prepare(iter_items(files))
        it = iter_items(files)
        while chunk := list(islice(it, CHUNK)):
            for s in p.chunk(chunk):
                report.add(s)
            if progress is not None:
                progress(p.n, p.captured)
    finally:
        files_doc = p.close()
    return manifest(
        out,
        lm.spec,
        lm.dtype,
        lm.device,
        layers,
        layout,
        files_doc,
        p.layout.enc.report(),
        p.counts(),
        report,
        files,
        time.monotonic() - t0,
        capture=p.identity,
        **({"engine": lm.to_json()} if isinstance(lm, EngineTarget) else {}),
    )
