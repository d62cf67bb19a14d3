"""Backends made by kind. The table of kinds, ``config.BACKENDS``, is config data (it names each
implementation as a "module:Class" string); here that implementation is imported, only when a
backend of its kind is made, so the manifest never pulls in aiohttp, torch or vLLM."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ...config import BACKENDS

if TYPE_CHECKING:
    from ...config import Manifest
    from ...formats import BoundFormat
    from .base import Backend


def backend_class(kind: str) -> type[Backend]:
    """The class that implements ``kind``: what is asked of a kind (its cost, its preflight
    checks) is asked of it, never switched on elsewhere."""
    module, _, attr = BACKENDS[kind].implementation.partition(":")
    cls: type[Backend] = getattr(import_module(module), attr)
    return cls


def make_backend(name: str, cfg: Any, manifest: Manifest, bound: BoundFormat) -> Backend:
    cls: Any = backend_class(cfg.kind)  # each kind's constructor takes its own config model
    backend: Backend = cls(name, cfg, manifest, bound)
    return backend
