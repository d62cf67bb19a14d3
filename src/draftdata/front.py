"""The library's front door behind ``draftdata.X``: each name imported from the module that
defines it the first time it is asked for, then kept on the package (``draftdata/__init__.py``
asks here, so ``import draftdata`` itself imports nothing)."""

from __future__ import annotations

import sys
from importlib import import_module

#: name -> the module that defines it
FRONT_DOOR = {
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


def attribute(name: str) -> object:
    """``draftdata.<name>``: the front door's object, kept on the package once imported; an
    AttributeError for any other name."""
    module = FRONT_DOOR.get(name)
    if module is None:
        raise AttributeError(f"module 'draftdata' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    setattr(sys.modules["draftdata"], name, value)
    return value
