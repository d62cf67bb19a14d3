"""The report's sample viewer data: ``RUN/export/preview.json``, written by the export.

The report has no tokenizer, so the export, which has one, writes down how the first few samples
of each dataset (the first rows of that dataset in the shards: both list the ledger's samples in
the same order) read token by token: each token's id, its text, whether it is a control token and
whether it is trained on. A long sample is cut to a window of ``MAX_TOKENS`` tokens around the
prompt/answer boundary (the prompt's tail and the answer's start); the window's bounds say what
was cut. This module holds the file's format both ways: ``write_preview`` and ``read_preview``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DraftdataError
from ..files import write_json
from ..records import Sample
from .shards import now_iso

if TYPE_CHECKING:
    from ..tokenizers.base import Tokenizer

PREVIEW_FILE = "preview.json"
PREVIEW_VERSION = 1
PER_DATASET = 3
MAX_TOKENS = 400
#: prompt tokens a cut sample keeps at least (where the prompt has them)
PROMPT_TAIL = 100


@dataclass(frozen=True)
class PreviewToken:
    id: int
    text: str | None  # None: the tokenizer has no entry for this id
    control: bool
    trained: bool

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "control": self.control, "trained": self.trained}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PreviewToken:
        text = d.get("text")
        return cls(
            int(d["id"]),
            None if text is None else str(text),
            bool(d["control"]),
            bool(d["trained"]),
        )


@dataclass(frozen=True)
class PreviewSample:
    """One sample's tokens ``input_ids[start:end]``; ``length`` is the sample's full length."""

    id: str
    prompt_len: int
    length: int
    start: int
    end: int
    token_source: str
    finish_reason: str
    warnings: tuple[str, ...]
    tokenizer_sha256: str  # what made the sample (the texts come from the export's tokenizer)
    tokens: tuple[PreviewToken, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt_len": self.prompt_len,
            "length": self.length,
            "start": self.start,
            "end": self.end,
            "token_source": self.token_source,
            "finish_reason": self.finish_reason,
            "warnings": list(self.warnings),
            "tokenizer_sha256": self.tokenizer_sha256,
            "tokens": [t.to_json() for t in self.tokens],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PreviewSample:
        return cls(
            id=str(d["id"]),
            prompt_len=int(d["prompt_len"]),
            length=int(d["length"]),
            start=int(d["start"]),
            end=int(d["end"]),
            token_source=str(d["token_source"]),
            finish_reason=str(d["finish_reason"]),
            warnings=tuple(str(w) for w in d.get("warnings") or ()),
            tokenizer_sha256=str(d.get("tokenizer_sha256", "")),
            tokens=tuple(PreviewToken.from_json(t) for t in d["tokens"]),
        )


@dataclass(frozen=True)
class Preview:
    tokenizer_sha256: str
    created_at: str
    datasets: dict[str, tuple[PreviewSample, ...]]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PREVIEW_VERSION,
            "tokenizer_sha256": self.tokenizer_sha256,
            "created_at": self.created_at,
            "per_dataset": PER_DATASET,
            "max_tokens": MAX_TOKENS,
            "datasets": {k: [s.to_json() for s in v] for k, v in self.datasets.items()},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Preview:
        return cls(
            tokenizer_sha256=str(d.get("tokenizer_sha256", "")),
            created_at=str(d.get("created_at", "")),
            datasets={
                str(k): tuple(PreviewSample.from_json(s) for s in v)
                for k, v in (d.get("datasets") or {}).items()
            },
        )


def window(prompt_len: int, length: int, cap: int = MAX_TOKENS) -> tuple[int, int]:
    """[start, end) of at most ``cap`` ids: the answer's start, after the prompt's tail (at least
    ``PROMPT_TAIL`` prompt ids where there are that many, more where the answer is short)."""
    if length <= cap:
        return 0, length
    answer = length - prompt_len
    keep_answer = min(answer, cap - min(prompt_len, PROMPT_TAIL))
    keep_prompt = min(prompt_len, cap - keep_answer)
    return prompt_len - keep_prompt, prompt_len + keep_answer


def _text(tok: Tokenizer, token_id: int) -> str | None:
    try:
        return tok.token_str(token_id)
    except (DraftdataError, KeyError, IndexError, ValueError):
        return None


def preview_sample(s: Sample, tok: Tokenizer) -> PreviewSample:
    start, end = window(s.prompt_len, len(s.input_ids))
    control = tok.control_ids
    tokens = tuple(
        PreviewToken(i, _text(tok, i), i in control, bool(m))
        for i, m in zip(s.input_ids[start:end], s.loss_mask[start:end], strict=True)
    )
    return PreviewSample(
        id=s.id,
        prompt_len=s.prompt_len,
        length=len(s.input_ids),
        start=start,
        end=end,
        token_source=s.token_source,
        finish_reason=s.finish_reason,
        warnings=tuple(s.warnings),
        tokenizer_sha256=s.provenance.tokenizer_sha256,
        tokens=tokens,
    )


def write_preview(first: Mapping[str, Sequence[Sample]], tok: Tokenizer, folder: Path) -> Path:
    """Write ``folder/preview.json``: the first ``PER_DATASET`` samples of each dataset (``first``:
    dataset -> its first samples in export order), token by token under ``tok``. Returns its
    path."""
    datasets = {
        name: tuple(preview_sample(s, tok) for s in samples[:PER_DATASET])
        for name, samples in first.items()
    }
    doc = Preview(tok.sha256, now_iso(), datasets).to_json()
    return write_json(folder / PREVIEW_FILE, doc)


def read_preview(folder: Path) -> Preview | None:
    """``folder/preview.json``, or None where the export wrote none (older exports). Raises
    ValueError where the file is there but not a preview."""
    path = folder / PREVIEW_FILE
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("datasets"), dict):
        raise ValueError("not a sample preview (no 'datasets' object)")
    try:
        return Preview.from_json(doc)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a sample preview ({type(e).__name__}: {e})") from e
