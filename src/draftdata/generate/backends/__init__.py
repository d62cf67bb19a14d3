"""Backends that answer prompts: a local engine (exact ids) or an OpenAI-compatible API.

``config.BACKENDS`` is the table of kinds; ``make_backend`` makes one of them and
``base.Backend`` is the interface each implements."""

from .registry import make_backend

__all__ = ["make_backend"]
