"""Backends that answer prompts: a local engine (exact ids) or an OpenAI-compatible API.

``registry.BACKENDS`` is the table of kinds; ``base.Backend`` the interface each implements."""

from .registry import BACKENDS, BackendCfg, BackendKind, make_backend

__all__ = ["BACKENDS", "BackendCfg", "BackendKind", "make_backend"]
