"""Read the tokenizer out of a GGUF model file (metadata only; tensors are never touched)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import TokenizerError
from .base import file_sha256
from .hf import HFTokenizer

_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
# llama.cpp token types
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def _read(f: BinaryIO, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise TokenizerError(
            f"{getattr(f, 'name', 'GGUF')}: file ends inside the metadata; it is "
            "truncated — download it again"
        )
    return b


def _value(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if vtype == _STRING:
        (n,) = struct.unpack("<Q", _read(f, 8))
        return _read(f, n).decode("utf-8", errors="replace")
    if vtype == _ARRAY:
        (itype,) = struct.unpack("<I", _read(f, 4))
        (count,) = struct.unpack("<Q", _read(f, 8))
        if itype in _SCALARS:
            fmt = _SCALARS[itype]
            size = struct.calcsize(fmt)
            data = _read(f, size * count)
            return [v[0] for v in struct.iter_unpack(fmt, data)]
        return [_value(f, itype) for _ in range(count)]
    raise TokenizerError(
        f"unknown GGUF value type {vtype}; the file may be from a newer GGUF version"
    )


def read_gguf_metadata(
    path: Path, prefix: tuple[str, ...] = ("tokenizer.", "general.")
) -> dict[str, Any]:
    """Key/value metadata of a GGUF file, limited to keys with the given prefixes."""
    out: dict[str, Any] = {}
    try:
        with path.open("rb") as f:
            if _read(f, 4) != b"GGUF":
                raise TokenizerError(f"{path}: not a GGUF file (bad magic)")
            (version,) = struct.unpack("<I", _read(f, 4))
            if version < 2:
                raise TokenizerError(f"{path}: GGUF version {version} is too old; convert it again")
            _n_tensors, n_kv = struct.unpack("<QQ", _read(f, 16))
            for _ in range(n_kv):
                key = _value(f, _STRING)
                (vtype,) = struct.unpack("<I", _read(f, 4))
                val = _value(f, vtype)
                if key.startswith(prefix):
                    out[key] = val
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read ({e})") from e
    return out


def hf_spec_from_gguf(meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """Build a tokenizer.json document equivalent to the GGUF tokenizer (the way transformers'
    GGUF loader converts a ``gpt2``-model vocabulary)."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise TokenizerError(
            f"{path}: GGUF tokenizer model {model!r} is not supported yet (only byte-level BPE, "
            "'gpt2'); export the tokenizer as tokenizer.json and pass that instead"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    merges: list[str] = meta.get("tokenizer.ggml.merges") or []
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": typ == _CONTROL,
        }
        for i, (t, typ) in enumerate(zip(tokens, types, strict=True))
        if typ in (_CONTROL, _USER_DEFINED)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ", 1) for m in merges],
        },
    }


def load_gguf_tokenizer(path: Path, chat_template: str | None = None) -> HFTokenizer:
    meta = read_gguf_metadata(path)
    if "tokenizer.ggml.tokens" not in meta:
        raise TokenizerError(f"{path}: this GGUF file carries no tokenizer (tokenizer.ggml.tokens)")
    spec = hf_spec_from_gguf(meta, path)
    tpl = chat_template if chat_template is not None else meta.get("tokenizer.chat_template")
    return HFTokenizer(spec, path=path, sha256=file_sha256(path), kind="gguf", chat_template=tpl)
