"""The manifest's ``[backends.NAME]`` tables, one pydantic model per backend kind. Pure config:
nothing here imports a backend's implementation."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HFBackendCfg(_Strict):
    kind: Literal["hf"]
    model_path: str
    device: str = "cpu"
    batch_size: int = Field(8, ge=1, le=4096)


class OpenAIBackendCfg(_Strict):
    kind: Literal["openai"]
    base_url: str
    api_key_env: str | None = None
    #: the model name sent to this endpoint (default: target.model); "" sends none
    model: str | None = None
    concurrency: int = Field(16, ge=1, le=4096)
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(6, ge=0, le=100)
    rpm: float | None = Field(None, gt=0)
    tpm: float | None = Field(None, gt=0)
    price_in_per_mtok: float = Field(0.0, ge=0)
    price_out_per_mtok: float = Field(0.0, ge=0)
    extra_body: dict[str, Any] = {}
    token_ids: Literal["auto", "always", "never"] = "auto"

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://", v):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")


class EngineBackendCfg(_Strict):
    """vLLM / SGLang offline engines (imported lazily where installed)."""

    kind: Literal["vllm", "sglang"]
    model_path: str
    batch_size: int = Field(256, ge=1)
    engine_args: dict[str, Any] = {}
