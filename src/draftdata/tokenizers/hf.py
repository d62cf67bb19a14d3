"""HF ``tokenizers`` backends: a tokenizer folder, a bare tokenizer.json, or one built from GGUF."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFCore

from ..errors import TokenizerError
from ..nesting import loads_json
from .base import TokenInfo, Tokenizer
from .fast_bpe import FAST, FastBPE, fast_bpe, fast_from_snapshot, read_snapshot, write_snapshot

log = logging.getLogger("draftdata.tokenizers")


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
    """A tokenizer described by a HF ``tokenizer.json`` document.

    Loaded from a file whose fast path was verified before (``fast_bpe.read_snapshot``), the
    document is not parsed: the snapshot answers what reconstruction asks (ordinary text through
    tiktoken; the added vocabulary, its stock encodings and decodings; the vocabulary's size),
    and anything else parses the file then (``_full``), checked to be the file loaded."""

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
        source: Path | None = None,
    ) -> None:
        self._describe(path, sha256, kind, chat_template, config, source)
        try:
            full = HFCore.from_str(text if text is not None else json.dumps(spec))
            self.__dict__["_full"] = full
            self.__dict__["_plain"] = _without_added(full)
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise TokenizerError(
                f"{path}: not a valid tokenizer.json ({e}); point --tokenizer at the file a "
                "model repository ships"
            ) from e
        self._byte_level = _uses_byte_level(spec)
        self._added = list(spec.get("added_tokens") or [])
        self._spec = spec

    def _describe(
        self,
        path: Path,
        sha256: str,
        kind: str,
        chat_template: str | None,
        config: dict[str, Any] | None,
        source: Path | None,
    ) -> None:
        """What every load sets, whether it parses the document or reads its snapshot."""
        self.path = path
        self.sha256 = sha256
        self.kind = kind
        self.chat_template = chat_template
        self.config = config or {}
        #: the tokenizer.json this came from (a snapshot is kept for it), None: a document
        self._source = source
        self._snap: dict[str, Any] | None = None

    # --- constructors --------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: Path, chat_template: str | None = None) -> HFTokenizer:
        return cls._load(path, path=path, kind="tokenizer.json", chat_template=chat_template)

    @classmethod
    def from_folder(cls, folder: Path, chat_template: str | None = None) -> HFTokenizer:
        cfg_path = folder / "tokenizer_config.json"
        config = _read_json(cfg_path) if cfg_path.exists() else {}
        if chat_template is None:
            chat_template = _template_from(folder, config)
        return cls._load(
            folder / "tokenizer.json",
            path=folder,
            kind="hf-folder",
            chat_template=chat_template,
            config=config,
        )

    @classmethod
    def _load(
        cls,
        tj: Path,
        *,
        path: Path,
        kind: str,
        chat_template: str | None,
        config: dict[str, Any] | None = None,
    ) -> HFTokenizer:
        raw = _read_bytes(tj)
        sha256 = hashlib.sha256(raw).hexdigest()
        snap = read_snapshot(sha256)
        if snap is not None:
            self = cls.__new__(cls)
            self._describe(path, sha256, kind, chat_template, config, tj)
            self._snap, self._byte_level, self._spec = snap, True, {}
            self._added = list(snap["added"])
            fast = fast_from_snapshot(snap, lambda: self._plain)
            if fast is not None:
                self.__dict__["_fast_and_why"] = (fast, FAST)
                return self
        text, spec = _parse_json(tj, raw)
        return cls(
            spec,
            text=text,
            path=path,
            sha256=sha256,
            kind=kind,
            chat_template=chat_template,
            config=config,
            source=tj,
        )

    # --- the stock tokenizer, parsed when first needed ----------------------------------
    @cached_property
    def _full(self) -> HFCore:
        """The stock tokenizer of a tokenizer loaded from its snapshot, parsed now (set at once
        by every other load)."""
        src = self._source
        assert src is not None  # only a snapshot's tokenizer starts without it
        raw = _read_bytes(src)
        if hashlib.sha256(raw).hexdigest() != self.sha256:
            raise TokenizerError(
                f"{src}: changed on disk since it was loaded; load the tokenizer again"
            )
        log.debug("parsing %s (a question its snapshot does not answer)", src)
        try:
            return HFCore.from_str(raw.decode("utf-8"))
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise TokenizerError(f"{src}: not a valid tokenizer.json ({e})") from e

    @cached_property
    def _plain(self) -> HFCore:
        return _without_added(self._full)

    # --- the encoder --------------------------------------------------------------------
    @cached_property
    def _fast_and_why(self) -> tuple[FastBPE | None, str]:
        if not self._byte_level:
            return None, "tokenizers (not a byte-level BPE)"
        fast, why = fast_bpe(
            self._spec, self.sha256, set(self._control), _BYTE_DECODER, self._plain
        )
        if fast is not None and self._source is not None:
            write_snapshot(self.sha256, fast, self._spec.get("normalizer"), self._facts())
        self._spec = {}  # only the checks needed the document
        return fast, why

    def _facts(self) -> dict[str, Any]:
        """What the stock tokenizer says about this file that a snapshot keeps."""
        return {
            "added": self._added,
            "vocab_size": self.vocab_size,
            "missing_bytes": sorted(self.unrepresentable_bytes),
            "stock": {a["content"]: self.encode_as_stock(a["content"]) for a in self._added},
            "decoded": {i: self.decode([i]) for i in self._control},
        }

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

    def _encode_ordinary_batch(self, texts: Sequence[str]) -> tuple[list[list[int]], Sequence[int]]:
        fast = self._fast_and_why[0]
        if fast is not None:
            return fast.encode_batch_marked(texts)
        encs = self._plain.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encs], range(len(texts))

    @property
    def _rank_ids(self) -> Collection[int]:
        fast = self._fast_and_why[0]
        return fast.ids if fast is not None else ()

    def encode_as_stock(self, text: str) -> list[int]:
        if self._snap is not None and text in self._snap["stock"]:
            return list(self._snap["stock"][text])
        return list(self._full.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        if self._snap is not None and len(ids) == 1 and ids[0] in self._snap["decoded"]:
            return str(self._snap["decoded"][ids[0]])
        return str(self._full.decode(ids, skip_special_tokens=False))

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
        if self._snap is not None:
            return int(self._snap["vocab_size"])
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
        if self._snap is not None:
            return frozenset(self._snap["missing_bytes"])
        table = _bytes_to_unicode()
        return frozenset(b for b in range(256) if self._full.token_to_id(table[b]) is None)

    @property
    def unrepresentable_bytes(self) -> frozenset[int]:
        return self._missing_bytes

    def vocab_strings(self) -> dict[str, int]:
        """Raw vocabulary entries (token strings in the model's alphabet) to ids."""
        return dict(self._full.get_vocab(with_added_tokens=False))


def _without_added(full: HFCore) -> HFCore:
    """The same model and pipeline without the added vocabulary (no added-token matching: text
    stays text), sharing the parsed model instead of parsing the file again."""
    plain = HFCore(full.model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if getattr(full, part) is not None:
            setattr(plain, part, getattr(full, part))
    return plain


def _read_json(path: Path) -> dict[str, Any]:
    return _parse_json(path, _read_bytes(path))[1]


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as e:
        raise TokenizerError(
            f"{path}: no such file; a HF tokenizer folder needs tokenizer.json"
        ) from e
    except OSError as e:
        raise TokenizerError(f"{path}: unreadable ({e.strerror}); check its permissions") from e


def _parse_json(path: Path, raw: bytes) -> tuple[str, dict[str, Any]]:
    """A JSON file's text (the tokenizers library parses it itself) and its object."""
    try:
        text = raw.decode("utf-8")
        data = loads_json(text)
    except ValueError as e:
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
