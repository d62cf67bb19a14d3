"""Backends that answer prompts: a local engine (exact ids) or an OpenAI-compatible API.

``config.BACKENDS`` is the table of kinds; ``make_backend`` makes one of them, ``backend_class``
names the class a kind's questions (cost, preflight checks) are asked of, and ``base.Backend`` is
the interface each implements."""

from .registry import backend_class, make_backend

__all__ = ["backend_class", "make_backend"]
