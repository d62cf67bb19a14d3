"""draftdata: token-exact training data for speculative-decoding drafters.

The library's front door (README, "From Python"): ``draftdata.load_target``, ``open_run``,
``Target``, ``Run``, ``Sample``, ``ApiView``, ``register_backend``, each imported on first use
(``draftdata/front.py``), so ``import draftdata`` imports nothing else; their types are in
``__init__.pyi``."""

__all__ = [
    "ApiView",
    "Message",
    "PackedSample",
    "Run",
    "Sample",
    "Target",
    "__version__",
    "load_target",
    "open_run",
    "register_backend",
]


def __getattr__(name: str) -> object:
    from .front import attribute

    return attribute(name)
