"""The manifest's ``[backends.NAME]`` tables, one pydantic model per backend kind. Pure config:
nothing here imports a backend's implementation."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

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
    #: the first retry's wait when the server names none (Retry-After); doubled on each retry
    backoff_s: float = Field(0.5, ge=0, le=60)
    rpm: float | None = Field(None, gt=0)
    tpm: float | None = Field(None, gt=0)
    price_in_per_mtok: float = Field(0.0, ge=0)
    price_out_per_mtok: float = Field(0.0, ge=0)
    extra_body: dict[str, Any] = {}
    token_ids: Literal["auto", "always", "never"] = "auto"
    #: an empty answer is asked again this many times, then kept (and dropped as empty)
    empty_retries: int = Field(2, ge=0, le=100)
    #: an answer body larger than this is stored, quarantined as oversized and not tokenized
    max_answer_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    #: the HTTP client: "auto" is the lean HTTP/1.1 client for http:// and aiohttp for https://
    http: Literal["auto", "lean", "aiohttp"] = "auto"
    #: what parses the answers (``tokens.servers``): its normalisations are undone or labelled
    #: ``lossy:*``; for vllm / sglang the request asks for the options that keep the text whole
    server: Literal["auto", "vllm", "sglang", "openrouter"] = "auto"

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


def redact_url(url: str) -> str:
    """``url`` with any user:password replaced by ``***``: for everything stored or printed."""
    u = urlsplit(url)
    if not (u.username or u.password):
        return url
    host = u.hostname or ""
    netloc = f"***@{host}" + (f":{u.port}" if u.port else "")
    return urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))
