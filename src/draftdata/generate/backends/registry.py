"""Backends by kind: the one table a new backend is added to.

Each entry names the manifest table's model, where the implementation lives (imported only when a
backend of that kind is made, so the manifest never pulls in aiohttp, torch or vLLM), and whether
the backend returns the model's exact ids (a local engine: its datasets serve as ground truth)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import BaseModel, Field

from .config import EngineBackendCfg, HFBackendCfg, OpenAIBackendCfg

if TYPE_CHECKING:
    from ...formats import BoundFormat
    from ...manifest import Manifest
    from .base import Backend


@dataclass(frozen=True)
class BackendKind:
    kind: str
    config: type[BaseModel]
    #: "module:Class", a Backend whose constructor is (name, cfg, manifest, bound)
    implementation: str
    #: returns the model's exact ids by construction
    exact_ids: bool
    summary: str


BACKENDS: dict[str, BackendKind] = {
    b.kind: b
    for b in (
        BackendKind(
            "hf",
            HFBackendCfg,
            "draftdata.generate.backends.local:HFBackend",
            True,
            "the target through transformers on CPU or CUDA (exact ids)",
        ),
        BackendKind(
            "openai",
            OpenAIBackendCfg,
            "draftdata.generate.backends.openai_api:OpenAIBackend",
            False,
            "any OpenAI-compatible chat-completions API (ids where the server returns them)",
        ),
        BackendKind(
            "vllm",
            EngineBackendCfg,
            "draftdata.generate.backends.engines:VLLMBackend",
            True,
            "vLLM's offline engine, where installed (exact ids)",
        ),
        BackendKind(
            "sglang",
            EngineBackendCfg,
            "draftdata.generate.backends.engines:SGLangBackend",
            True,
            "SGLang's offline engine, where installed (exact ids)",
        ),
    )
}

if TYPE_CHECKING:
    BackendCfg = HFBackendCfg | OpenAIBackendCfg | EngineBackendCfg
else:  # the manifest's tagged union, made from the table above
    BackendCfg = Annotated[
        Union[tuple(dict.fromkeys(b.config for b in BACKENDS.values()))],  # noqa: UP007
        Field(discriminator="kind"),
    ]


def make_backend(name: str, cfg: Any, manifest: Manifest, bound: BoundFormat) -> Backend:
    module, _, attr = BACKENDS[cfg.kind].implementation.partition(":")
    cls = getattr(import_module(module), attr)
    backend: Backend = cls(name, cfg, manifest, bound)
    return backend
