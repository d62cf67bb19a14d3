"""What a capture in a folder is: its layout, stored dtype, codec, layers, model and the layout's
own options. A folder holds one capture: it is recorded (``.draftdata-capture.json``) before the
first file is written, and a capture that asks for anything else of the same folder is refused
before it writes, so that a rerun with ``--dtype bf16`` or ``--layers 1,2,3`` can never leave a
folder of mixed files under a manifest that names only the last options (issue 53).

A folder captured by an older draftdata has no record: its manifest says the same things, and is
read in its place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import write_json
from .codec import MANIFEST
from .layers import Layers

#: the record of the capture a folder holds, written before its first file
CAPTURE_FILE = ".draftdata-capture.json"


def identity(
    layout: str,
    dtype: str,
    codec: str,
    layers: Layers,
    model_folder: Path | str,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "layout": layout,
        "dtype": dtype,
        "codec": codec,
        "aux_layers": list(layers.aux),
        "last_layer": layers.last,
        "model_folder": str(Path(model_folder).expanduser().resolve()),
        "options": {k: v for k, v in sorted((options or {}).items()) if v is not None},
    }


def _from_manifest(doc: dict[str, Any]) -> dict[str, Any]:
    """An older capture's identity, as far as its manifest says it."""
    if isinstance(doc.get("capture"), dict):
        return dict(doc["capture"])
    layers = doc.get("layers")
    layers = layers if isinstance(layers, dict) else {}
    out = {
        "layout": doc.get("layout"),
        "dtype": doc.get("dtype"),
        "codec": doc.get("codec"),
        "aux_layers": layers.get("aux"),
        "last_layer": layers.get("last"),
    }
    return {k: v for k, v in out.items() if v is not None}


def recorded(out: Path) -> dict[str, Any] | None:
    """The identity of the capture ``out`` holds (None: none yet)."""
    for name, read in ((CAPTURE_FILE, dict), (MANIFEST, _from_manifest)):
        path = out / name
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise InputError(
                f"{path}: not readable ({e}); it says what capture {out} holds: capture into "
                "another folder, or remove this one to capture it again"
            ) from e
        if isinstance(doc, dict):
            return read(doc)
    return None


def _show(key: str, value: Any) -> str:
    names = {"aux_layers": "aux layers", "last_layer": "last layer", "model_folder": "model"}
    return f"{names.get(key, key)} {value}"


def claim(out: Path, want: dict[str, Any]) -> None:
    """Refuse ``out`` where it holds another capture; else record ``want`` as what it holds."""
    refuse_other(out, want)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / CAPTURE_FILE, want)


def refuse_other(out: Path, want: dict[str, Any]) -> None:
    """An InputError naming the difference where ``out`` holds a capture other than ``want``."""
    had = recorded(out)
    if had is not None:
        diff = [k for k in want if k in had and had[k] != want[k]]
        if diff:
            theirs = ", ".join(_show(k, had[k]) for k in diff)
            ours = ", ".join(_show(k, want[k]) for k in diff)
            raise InputError(
                f"{out} holds a capture with {theirs}; this one asks {ours}: a folder holds one "
                "capture, so capture into another -o, or remove the folder to capture it again"
            )
