"""The bytes of the hidden-state files: their sha256, the lossless byte codec over draftdata's
own shards, and the one checked read every reader goes through.

Every hidden-state file's sha256 is recorded in ``draftdata-hidden-states.json`` (``sha256``:
path relative to the output folder -> hex digest) when it is written. ``read_checked`` reads a
file whole, refuses it when its digest is not the recorded one (a flipped bit, a truncated copy,
a file replaced by another), and only then decodes it: ``.zst`` files are one zstd frame over
a whole safetensors file (``zstandard``, level ``ZSTD_LEVEL``)."""

from __future__ import annotations

import hashlib
import io
import json
import struct
from pathlib import Path
from typing import Any

from ..errors import DraftdataError, InputError

__all__ = [
    "CODECS",
    "MANIFEST",
    "CorruptFileError",
    "compress",
    "decode_tensors",
    "load_tensors",
    "read_checked",
    "safetensors_metadata",
    "sha256_bytes",
    "sha256_file",
]

MANIFEST = "draftdata-hidden-states.json"
#: byte codecs over draftdata's own shards (``--codec``)
CODECS = ("none", "zstd")
#: the file name's suffix for each codec
SUFFIX = {"none": "", "zstd": ".zst"}
#: zstd's level: 3 (its default) leaves an fp8 shard 1.2% larger than 9 does, at twice the speed
#: (SmolLM2, BENCHMARKS.md)
ZSTD_LEVEL = 3
_CHUNK = 1 << 24


class CorruptFileError(DraftdataError):
    """A hidden-state file is not the file that was written (its checksum or its ids differ)."""

    exit_code = 1


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as e:
        raise InputError(
            "--codec zstd needs zstandard; install it with pip install 'draftdata[hidden]'"
        ) from e
    return zstandard


def check_codec(codec: str) -> str:
    if codec not in CODECS:
        raise InputError(f"--codec {codec!r}: choose one of {', '.join(CODECS)}")
    if codec == "zstd":
        _zstd()
    return codec


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def compress(data: bytes, codec: str) -> bytes:
    if codec == "none":
        return data
    return bytes(_zstd().ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(data))


def _fix(path: Path) -> str:
    return (
        "the file changed after it was written; capture it again (rerun `draftdata "
        "hidden-states` with the same -o: it captures again every file whose checksum is wrong)"
    )


def read_checked(path: Path, sha256: str | None) -> bytes:
    """The bytes of ``path``, checked against ``sha256`` (when one is recorded): a file that
    differs is a ``CorruptFileError`` naming it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorruptFileError(f"{path}: cannot read it ({e.strerror})") from e
    if sha256 is not None:
        got = sha256_bytes(data)
        if got != sha256:
            raise CorruptFileError(
                f"{path}: sha256 {got[:16]}... is not the {sha256[:16]}... recorded in "
                f"{MANIFEST}: {_fix(path)}"
            )
    return data


def safetensors_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's bytes (``safetensors.torch.load`` drops it)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    return dict(header.get("__metadata__") or {})


def decode_tensors(path: Path, data: bytes, torch: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors of a hidden-state file's bytes (``.safetensors``, ``.safetensors.zst``, or a
    ``torch.save`` file: SpecForge's ``.ckpt``, ModelOpt's ``.pt``) and its safetensors metadata;
    bytes that do not decode are a ``CorruptFileError`` naming ``path``."""
    try:
        if path.name.endswith(".zst"):
            data = _zstd().ZstdDecompressor().decompress(data)
        if path.suffix in (".ckpt", ".pt"):
            return torch.load(io.BytesIO(data), weights_only=True), {}
        from safetensors.torch import load

        return load(data), safetensors_metadata(data)
    except InputError:
        raise
    except Exception as e:  # a damaged frame or file (its checksum held, or none was recorded)
        raise CorruptFileError(f"{path}: not a readable tensor file ({e}): {_fix(path)}") from e


def load_tensors(
    path: Path, sha256: str | None, torch: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """``decode_tensors`` over ``read_checked``: the one read of a recorded file."""
    return decode_tensors(path, read_checked(path, sha256), torch)
