"""The local transformers engine as a backend: exact ids, batched, on CPU or CUDA."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from ...config import HFBackendCfg, Manifest
from ...formats import BoundFormat
from ...model.folders import ensure_hf_folder, resolve_model
from .base import Backend, Began, Completion, GenRequest, OnFailure, model_path_problems
from .engines import engine_completion


class HFBackend(Backend):
    kind = "hf"
    batches_turns = True

    def __init__(self, name: str, cfg: HFBackendCfg, m: Manifest, bound: BoundFormat) -> None:
        super().__init__(name)
        from .hf import HFEngine

        spec = (
            cfg.model_path if cfg.model_path.startswith("pkg:") else str(m.resolve(cfg.model_path))
        )
        folder, gguf = resolve_model(spec)
        if gguf is not None:
            # dequantising a GGUF takes ~25 s on every load; a converted folder loads in ~0.1 s
            folder = ensure_hf_folder(folder / gguf)
        self.engine: Any = HFEngine(folder, device=cfg.device)
        self.cfg = cfg
        self.bound = bound
        self.batch_size = cfg.batch_size
        self.cancel = threading.Event()

    @classmethod
    def preflight(cls, name: str, cfg: HFBackendCfg, m: Manifest) -> list[str]:
        return model_path_problems(name, cfg.model_path, m)

    async def run_batch(
        self, requests: Sequence[GenRequest], on_failure: OnFailure
    ) -> list[Completion | None]:
        try:
            return await asyncio.to_thread(self._run, requests)
        except asyncio.CancelledError:
            # Ctrl-C: the decode loop stops at its next step instead of finishing the batch
            self.cancel.set()
            raise

    def _run(self, requests: Sequence[GenRequest]) -> list[Completion | None]:
        # one generate call takes one sampling setting: group, then chunk by batch_size
        groups: dict[tuple[float, float, int], list[int]] = {}
        for i, r in enumerate(requests):
            s = r.sampling
            groups.setdefault((s.temperature, s.top_p, s.max_tokens), []).append(i)
        out: list[Completion | None] = [None] * len(requests)
        stops = set(self.bound.stop_ids)
        for (temp, top_p, max_tokens), idx in groups.items():
            for k in range(0, len(idx), self.cfg.batch_size):
                chunk = idx[k : k + self.cfg.batch_size]
                t0 = Began.now()
                res = self.engine.generate(
                    [requests[i].prompt_ids for i in chunk],
                    max_new_tokens=max_tokens,
                    temperature=temp,
                    top_p=top_p,
                    seeds=[requests[i].seed for i in chunk] if temp > 0 else None,
                    stop_ids=stops,
                    cancel=self.cancel,
                )
                for i, o in zip(chunk, res, strict=True):
                    out[i] = engine_completion(
                        self.bound, requests[i], list(o.output_ids), o.finish_reason, "hf", t0
                    )
        return out
