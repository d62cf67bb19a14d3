"""HF ``tokenizers`` backends: a tokenizer folder, a bare tokenizer.json, or one built from GGUF."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFCore

from ..errors import TokenizerError
from .base import TokenInfo, Tokenizer, file_sha256
from .fast_bpe import FastBPE, fast_bpe


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by ByteLevel BPE."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


def _uses_byte_level(spec: dict[str, Any]) -> bool:
    dec = spec.get("decoder") or {}
    if dec.get("type") == "ByteLevel":
        return True
    return any(d.get("type") == "ByteLevel" for d in dec.get("decoders", []) or [])


class HFTokenizer(Tokenizer):
    """A tokenizer described by a HF ``tokenizer.json`` document."""

    def __init__(
        self,
        spec: dict[str, Any],
        *,
        path: Path,
        sha256: str,
        kind: str,
        chat_template: str | None = None,
        config: dict[str, Any] | None = None,
        text: str | None = None,
    ) -> None:
        self.path = path
        self.sha256 = sha256
        self.kind = kind
        self.chat_template = chat_template
        self.config = config or {}
        try:
            self._full = HFCore.from_str(text if text is not None else json.dumps(spec))
            # the same model and pipeline without the added vocabulary (no added-token matching:
            # text stays text), sharing the parsed model instead of parsing the file again
            self._plain = HFCore(self._full.model)
            for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
                if getattr(self._full, part) is not None:
                    setattr(self._plain, part, getattr(self._full, part))
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise TokenizerError(
                f"{path}: not a valid tokenizer.json ({e}); point --tokenizer at the file a "
                "model repository ships"
            ) from e
        self._byte_level = _uses_byte_level(spec)
        self._added = list(spec.get("added_tokens") or [])
        self._spec = spec

    # --- constructors --------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: Path, chat_template: str | None = None) -> HFTokenizer:
        text, spec = _read_json_text(path)
        return cls(
            spec,
            text=text,
            path=path,
            sha256=file_sha256(path),
            kind="tokenizer.json",
            chat_template=chat_template,
        )

    @classmethod
    def from_folder(cls, folder: Path, chat_template: str | None = None) -> HFTokenizer:
        tj = folder / "tokenizer.json"
        text, spec = _read_json_text(tj)
        cfg_path = folder / "tokenizer_config.json"
        config = _read_json(cfg_path) if cfg_path.exists() else {}
        if chat_template is None:
            chat_template = _template_from(folder, config)
        return cls(
            spec,
            text=text,
            path=folder,
            sha256=file_sha256(tj),
            kind="hf-folder",
            chat_template=chat_template,
            config=config,
        )

    # --- the encoder --------------------------------------------------------------------
    @cached_property
    def _fast_and_why(self) -> tuple[FastBPE | None, str]:
        if not self._byte_level:
            return None, "tokenizers (not a byte-level BPE)"
        fast, why = fast_bpe(
            self._spec, self.sha256, set(self._control), _BYTE_DECODER, self._plain
        )
        self._spec = {}  # only the checks needed the document
        return fast, why

    @property
    def encoder(self) -> str:
        """Which library encodes ordinary text here, and why (the fast path's verdict)."""
        return self._fast_and_why[1]

    # --- protocol ------------------------------------------------------------------------
    def _encode_ordinary(self, text: str) -> list[int]:
        fast = self._fast_and_why[0]
        if fast is not None:
            return fast.encode(text)
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:  # type: ignore[override]
        fast = self._fast_and_why[0]
        if fast is not None:
            out, from_plain = fast.encode_batch_marked(texts)
            checked: Iterable[list[int]] = out
            if self.control_ids.isdisjoint(fast.ids):  # tiktoken's own ids need no check
                checked = (out[i] for i in from_plain)
        else:
            encs = self._plain.encode_batch(list(texts), add_special_tokens=False)
            checked = out = [list(e.ids) for e in encs]
        for ids in checked:
            if not self.control_ids.isdisjoint(ids):
                return [self.encode(t) for t in texts]  # raises with the precise message
        return out

    def encode_as_stock(self, text: str) -> list[int]:
        return list(self._full.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._full.decode(list(ids), skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes:
        info = self.control_tokens.get(token_id)
        if info is not None:
            return info.text.encode()
        tok = self._full.id_to_token(token_id)
        if tok is None:
            raise TokenizerError(
                f"id {token_id} is outside the vocabulary (size {self.vocab_size})"
            )
        if self._byte_level:
            try:
                return bytes(_BYTE_DECODER[c] for c in tok)
            except KeyError:
                pass
        if tok.startswith("<0x") and tok.endswith(">") and len(tok) == 6:  # byte fallback
            return bytes([int(tok[3:5], 16)])
        return tok.replace("\u2581", " ").encode()

    @cached_property
    def _vocab_size(self) -> int:
        return int(self._full.get_vocab_size(with_added_tokens=True))

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @cached_property
    def _control(self) -> dict[int, TokenInfo]:
        return {
            int(a["id"]): TokenInfo(
                int(a["id"]), str(a["content"]), "special" if a.get("special") else "added"
            )
            for a in self._added
        }

    @property
    def control_tokens(self) -> dict[int, TokenInfo]:
        return self._control

    def token_to_id(self, text: str) -> int | None:
        tid = self._full.token_to_id(text)
        return None if tid is None else int(tid)

    @cached_property
    def _missing_bytes(self) -> frozenset[int]:
        if not self._byte_level:
            return frozenset()
        table = _bytes_to_unicode()
        return frozenset(b for b in range(256) if self._full.token_to_id(table[b]) is None)

    @property
    def unrepresentable_bytes(self) -> frozenset[int]:
        return self._missing_bytes

    def vocab_strings(self) -> dict[str, int]:
        """Raw vocabulary entries (token strings in the model's alphabet) to ids."""
        return dict(self._full.get_vocab(with_added_tokens=False))


def _read_json(path: Path) -> dict[str, Any]:
    return _read_json_text(path)[1]


def _read_json_text(path: Path) -> tuple[str, dict[str, Any]]:
    """A JSON file's text (the tokenizers library parses it itself) and its object."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except FileNotFoundError as e:
        raise TokenizerError(
            f"{path}: no such file; a HF tokenizer folder needs tokenizer.json"
        ) from e
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path}: unreadable JSON ({e}); re-download the file") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object at the top level")
    return text, data


def _template_from(folder: Path, config: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    tpl = config.get("chat_template")
    if isinstance(tpl, str):
        return tpl
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        for entry in tpl:
            if isinstance(entry, dict) and entry.get("name") == "default":
                return str(entry.get("template"))
    return None
