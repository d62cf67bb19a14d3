"""tiktoken rank files (Kimi K2, Qwen3.5/3.6) with their pattern and special-token table.

A rank file alone does not say how to split text or where control tokens live. That comes from a
*profile*: a JSON document with ``pat_str`` (string or list of alternatives joined by ``|``),
optional ``normalize`` (``"NFC"``), optional ``gigatoken`` (the gigatoken pre-tokenizer that claims
to split as ``pat_str`` does: ``fast_tiktoken``), and the special tokens, either as ``special_tokens`` (list of
names from ``special_start``) or read from a ``tokenizer_config.json`` beside the rank file
(``added_tokens_decoder``) with ``num_special_ids`` reserved ids after the ranks. Built-in profiles
are matched by the rank file's sha256; a profile can also sit beside the file as
``<rankfile>.profile.json`` or ``tiktoken.profile.json``.
"""

from __future__ import annotations

import binascii
import json
import unicodedata
from collections.abc import Collection, Iterable, Sequence
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tiktoken

from ..errors import TokenizerError
from ..nesting import loads_json
from .base import TokenInfo, Tokenizer, encode_threaded, file_sha256
from .fast_tiktoken import FAST_MIN_CHARS, FastTiktoken, enabled, fast_tiktoken

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def builtin_profiles() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for entry in resources.files("draftdata.tokenizers.profiles").iterdir():
        if entry.name.endswith(".json"):
            prof = json.loads(entry.read_text(encoding="utf-8"))
            out[str(prof["sha256"])] = prof
    return out


def _load_ranks(path: Path) -> dict[bytes, int]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read ({e})") from e
    try:  # the whole file at once (base64.b64decode per line was 0.16 s of Kimi's 0.4 s load)
        pairs = [ln.split() for ln in data.splitlines() if ln.strip()]
        return {binascii.a2b_base64(tok): int(rank) for tok, rank in pairs}
    except ValueError:  # binascii.Error is one: find the line to name
        pass
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            tok, rank = line.split()
            binascii.a2b_base64(tok)
            int(rank)
        except ValueError as e:
            raise TokenizerError(
                f"{path}:{lineno}: not a tiktoken rank line ('<base64> <rank>')"
            ) from e
    raise TokenizerError(f"{path}: not a tiktoken rank file ('<base64> <rank>' per line)")


class TiktokenTokenizer(Tokenizer):
    def __init__(
        self,
        *,
        path: Path,
        sha256: str,
        name: str,
        ranks: dict[bytes, int],
        pat_str: str,
        specials: dict[int, TokenInfo],
        normalize: str | None,
        chat_template: str | None,
        scheme: str | None = None,
    ) -> None:
        self.path = path
        self._scheme = scheme
        self.sha256 = sha256
        self.kind = f"tiktoken:{name}"
        self.chat_template = chat_template
        self._normalize = normalize
        self._specials = specials
        self._ranks = ranks  # tiktoken keeps them too
        try:
            self._enc = tiktoken.Encoding(
                name,
                pat_str=pat_str,
                mergeable_ranks=ranks,
                special_tokens={t.text: i for i, t in specials.items()},
            )
        except Exception as e:  # tiktoken raises ValueError / pyo3 errors
            raise TokenizerError(f"{path}: tiktoken rejected the profile ({e})") from e
        self._n_vocab = max(len(ranks) + len(specials), max(specials, default=0) + 1)

    @classmethod
    def from_file(
        cls, path: Path, *, profile: dict[str, Any] | None = None, chat_template: str | None = None
    ) -> TiktokenTokenizer:
        sha = file_sha256(path)
        prof = profile or _find_profile(path, sha)
        ranks = _load_ranks(path)
        pat = prof["pat_str"]
        pat_str = "|".join(pat) if isinstance(pat, list) else str(pat)
        specials = _specials_from(prof, path, n_ranks=len(ranks))
        if chat_template is None:
            tpl = path.parent / "chat_template.jinja"
            chat_template = tpl.read_text(encoding="utf-8") if tpl.exists() else None
        return cls(
            path=path,
            sha256=sha,
            name=str(prof.get("name", path.stem)),
            ranks=ranks,
            pat_str=pat_str,
            specials=specials,
            normalize=prof.get("normalize"),
            chat_template=chat_template,
            scheme=prof.get("gigatoken"),
        )

    # --- protocol ------------------------------------------------------------------------
    def _prep(self, text: str) -> str:
        return unicodedata.normalize(self._normalize, text) if self._normalize else text  # type: ignore[arg-type]

    @cached_property
    def _fast_and_why(self) -> tuple[FastTiktoken | None, str]:
        def reference(texts: Sequence[str]) -> list[list[int]]:
            return [self._enc.encode_ordinary(self._prep(t)) for t in texts]

        return fast_tiktoken(self.path, self._scheme, reference)

    @property
    def encoder(self) -> str:
        """Which library encodes ordinary text here, and why (the fast path's verdict)."""
        return self._fast_and_why[1]

    def _encode_ordinary(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(self._prep(text))

    def _encode_ordinary_batch(self, texts: Sequence[str]) -> tuple[list[list[int]], Sequence[int]]:
        # gigatoken only for a batch large enough to gain from it: it is loaded on the first
        # (75 MB of tables and pool), and a process that encodes little never loads it
        big = enabled() and sum(map(len, texts)) >= FAST_MIN_CHARS
        if big and (fast := self._fast_and_why[0]) is not None:
            # its ids are ranks too: a control id is none of them
            return fast.encode_batch(
                [self._prep(t) for t in texts] if self._normalize else texts
            ), ()
        return encode_threaded(self._encode_ordinary, texts), ()

    def encode_batch_arrays(self, texts: Sequence[str]) -> list[npt.NDArray[np.int32]] | None:
        # gigatoken's ids are ranks: with no control id among them there is nothing to check
        if not enabled() or sum(map(len, texts)) < FAST_MIN_CHARS or self._ranks_hold_control:
            return None
        fast = self._fast_and_why[0]
        if fast is None:
            return None
        return fast.encode_arrays([self._prep(t) for t in texts] if self._normalize else texts)

    @property
    def _rank_ids(self) -> Collection[int]:
        return self._ranks.values()

    def encode_as_stock(self, text: str) -> list[int]:
        # Kimi's and Qwen's own code encode with allowed_special="all".
        return self._enc.encode(self._prep(text), allowed_special="all")

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode_bytes(list(ids)).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        try:
            return self._enc.decode_single_token_bytes(token_id)
        except KeyError as e:
            raise TokenizerError(
                f"id {token_id} is outside the vocabulary ({self.vocab_size})"
            ) from e

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def control_tokens(self) -> dict[int, TokenInfo]:
        return self._specials

    def token_to_id(self, text: str) -> int | None:
        info = self.control_by_text.get(text)
        if info:
            return info.id
        return self.ordinary_ids_by_bytes.get(text.encode())


def _find_profile(path: Path, sha: str) -> dict[str, Any]:
    for side in (
        path.with_name(path.name + ".profile.json"),
        path.parent / "tiktoken.profile.json",
    ):
        if side.exists():
            try:
                return dict(loads_json(side.read_text(encoding="utf-8")))
            except ValueError as e:
                raise TokenizerError(f"{side}: invalid JSON ({e})") from e
    prof = builtin_profiles().get(sha)
    if prof is None:
        raise TokenizerError(
            f"{path}: unknown tiktoken rank file (sha256 {sha[:12]}…); a rank file needs its split "
            f"pattern and special-token table: write them to {path.name}.profile.json beside it "
            "(keys: pat_str, special_start + special_tokens, or num_special_ids + tokenizer_config.json)"
        )
    return prof


def _specials_from(prof: dict[str, Any], path: Path, n_ranks: int) -> dict[int, TokenInfo]:
    specials: dict[int, TokenInfo] = {}
    if "special_tokens" in prof:
        start = int(prof.get("special_start", n_ranks))
        non_special = set(prof.get("non_special", []))
        for i, text in enumerate(prof["special_tokens"]):
            specials[start + i] = TokenInfo(
                start + i, text, "added" if text in non_special else "special"
            )
        return specials
    cfg_path = path.parent / "tokenizer_config.json"
    if not cfg_path.exists():
        raise TokenizerError(
            f"{path}: the profile takes special-token names from tokenizer_config.json, "
            f"which is missing beside it; copy the model's tokenizer_config.json there"
        )
    try:
        cfg = loads_json(cfg_path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise TokenizerError(f"{cfg_path}: invalid JSON ({e}); copy the model's file again") from e
    for key, entry in (cfg.get("added_tokens_decoder") or {}).items():
        tid = int(key)
        specials[tid] = TokenInfo(
            tid, str(entry["content"]), "special" if entry.get("special", True) else "added"
        )
    n_special = int(prof.get("num_special_ids", 0))
    fill = str(prof.get("reserved_name", "<|reserved_token_{id}|>"))
    for tid in range(n_ranks, n_ranks + n_special):
        if tid not in specials:
            specials[tid] = TokenInfo(tid, fill.format(id=tid), "special")
    return specials
