"""vLLM and SGLang offline engines: exact ids, imported lazily where installed (never in CI)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from ...config import EngineBackendCfg, Manifest
from ...errors import DraftdataError
from ...formats import BoundFormat, derive_view
from .base import Backend, Began, Completion, GenRequest, OnFailure, model_path_problems


class EngineUnavailable(DraftdataError):
    """The engine's Python package is not installed here."""


def engine_completion(
    bound: BoundFormat,
    req: GenRequest,
    ids: list[int],
    finish: str,
    engine: str,
    t0: Began | float,
) -> Completion:
    """An engine's answer as a Completion. ``t0``: when the request began (``Began.now()``;
    a plugin's ``time.time()`` is taken as the wall clock's start, its duration from it)."""
    if not isinstance(t0, Began):
        t0 = Began(t0, time.monotonic() - max(0.0, time.time() - t0))
    view = derive_view(bound, ids, finish)
    resp = {"engine": engine, "output_ids": ids, "finish_reason": finish}
    return Completion(
        request={
            "prompt_ids": req.prompt_ids,
            "sampling": req.sampling.model_dump(),
            "seed": req.seed,
        },
        response=resp,
        response_text="",
        finish_reason=finish,
        view=view,
        output_ids=tuple(ids),
        prompt_ids=tuple(req.prompt_ids),
        prompt_tokens=len(req.prompt_ids),
        completion_tokens=len(ids),
        started_at=t0.wall,
        latency_s=t0.elapsed(),
    )


class _Engine(Backend):
    """An offline engine over a model folder."""

    batches_turns = True

    @classmethod
    def preflight(cls, name: str, cfg: EngineBackendCfg, m: Manifest) -> list[str]:
        return model_path_problems(name, cfg.model_path, m)


class VLLMBackend(_Engine):
    kind = "vllm"

    def __init__(self, name: str, cfg: EngineBackendCfg, m: Manifest, bound: BoundFormat) -> None:
        super().__init__(name)
        self.batch_size = cfg.batch_size
        try:
            from vllm import LLM
        except ImportError as e:
            raise EngineUnavailable(
                f"backend {name}: vLLM is not installed; pip install vllm "
                'on a GPU machine, or use kind = "hf"'
            ) from e
        self.bound = bound
        self.llm = LLM(
            model=str(m.resolve(cfg.model_path)), skip_tokenizer_init=True, **cfg.engine_args
        )

    async def run_batch(
        self, requests: Sequence[GenRequest], on_failure: OnFailure
    ) -> list[Completion | None]:
        return await asyncio.to_thread(self._run, requests)

    def _run(self, requests: Sequence[GenRequest]) -> list[Completion | None]:
        from vllm import SamplingParams, TokensPrompt

        t0 = Began.now()
        stops = sorted(self.bound.stop_ids)
        params = [
            SamplingParams(
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                max_tokens=r.sampling.max_tokens,
                seed=r.seed,
                stop_token_ids=stops,
                detokenize=False,
            )
            for r in requests
        ]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests], params, use_tqdm=False
        )
        res: list[Completion | None] = []
        for r, o in zip(requests, outs, strict=True):
            c = o.outputs[0]
            finish = "length" if c.finish_reason == "length" else "stop"
            res.append(engine_completion(self.bound, r, list(c.token_ids), finish, "vllm", t0))
        return res


class SGLangBackend(_Engine):
    kind = "sglang"

    def __init__(self, name: str, cfg: EngineBackendCfg, m: Manifest, bound: BoundFormat) -> None:
        super().__init__(name)
        self.batch_size = cfg.batch_size
        try:
            import sglang
        except ImportError as e:
            raise EngineUnavailable(
                f"backend {name}: SGLang is not installed; pip install "
                'sglang on a GPU machine, or use kind = "hf"'
            ) from e
        self.bound = bound
        self.engine = sglang.Engine(
            model_path=str(m.resolve(cfg.model_path)), skip_tokenizer_init=True, **cfg.engine_args
        )

    async def run_batch(
        self, requests: Sequence[GenRequest], on_failure: OnFailure
    ) -> list[Completion | None]:
        return await asyncio.to_thread(self._run, requests)

    def _run(self, requests: Sequence[GenRequest]) -> list[Completion | None]:
        t0 = Began.now()
        stops = sorted(self.bound.stop_ids)
        params: list[dict[str, Any]] = [
            {
                "temperature": r.sampling.temperature,
                "top_p": r.sampling.top_p,
                "max_new_tokens": r.sampling.max_tokens,
                "stop_token_ids": stops,
                "sampling_seed": r.seed,
            }
            for r in requests
        ]
        outs = self.engine.generate(
            input_ids=[r.prompt_ids for r in requests], sampling_params=params
        )
        res: list[Completion | None] = []
        for r, o in zip(requests, outs, strict=True):
            ids = list(o["output_ids"])
            reason = (o.get("meta_info") or {}).get("finish_reason") or {}
            finish = "length" if reason.get("type") == "length" else "stop"
            res.append(engine_completion(self.bound, r, ids, finish, "sglang", t0))
        return res
