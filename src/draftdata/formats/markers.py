"""Markers: the control tokens a format names by text, and their check against a tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

from ..tokenizers import Tokenizer


@dataclass(frozen=True)
class MarkerSpec:
    """A control token the format uses, named by its text. ``id`` pins the id (checked at bind);
    ``optional`` markers may be missing from a tokenizer (their grammar then falls back to text)."""

    text: str
    id: int | None = None
    optional: bool = False


@dataclass(frozen=True)
class MarkerCheck:
    name: str
    text: str
    id: int | None
    kind: str  # special | added | ordinary | missing
    pinned: int | None
    encodes_to_one: bool
    decodes_back: bool
    text_stays_text: bool
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def check_marker(tok: Tokenizer, name: str, spec: MarkerSpec) -> MarkerCheck:
    info = tok.control_by_text.get(spec.text)
    stock = tok.encode_as_stock(spec.text)
    plain = tok.encode(spec.text)
    if info is None:
        kind = "missing" if len(stock) != 1 else "ordinary"
        problem = (
            None
            if spec.optional
            else (
                f"{spec.text!r} is not a special or added token of this tokenizer (it encodes to "
                f"{len(stock)} ordinary id(s) {stock[:8]}); this format does not fit this tokenizer"
            )
        )
        if spec.id is not None:
            problem = _pin_problem(tok, spec, None)
        return MarkerCheck(
            name, spec.text, None, kind, spec.id, len(stock) == 1, False, True, problem
        )
    encodes_to_one = stock == [info.id]
    decodes_back = tok.decode([info.id]) == spec.text
    text_stays_text = info.id not in plain
    problem = None
    if not encodes_to_one:
        problem = f"{spec.text!r} encodes to {stock}, not to its single id {info.id}"
    elif not decodes_back:
        problem = f"id {info.id} decodes to {tok.decode([info.id])!r}, not {spec.text!r}"
    if spec.id is not None and spec.id != info.id:
        problem = _pin_problem(tok, spec, info.id)
    return MarkerCheck(
        name,
        spec.text,
        info.id,
        info.kind,
        spec.id,
        encodes_to_one,
        decodes_back,
        text_stays_text,
        problem,
    )


def describe_id(tok: Tokenizer, token_id: int) -> str:
    """'163533 decodes to 'chas', an ordinary token' — what an id really is."""
    if not 0 <= token_id < tok.vocab_size:
        return f"{token_id} is outside the vocabulary (size {tok.vocab_size})"
    kind = tok.kind_of(token_id)
    article = "an" if kind in ("ordinary", "added") else "a"
    return f"{token_id} decodes to {tok.token_str(token_id)!r}, {article} {kind} token"


def _pin_problem(tok: Tokenizer, spec: MarkerSpec, real: int | None) -> str:
    assert spec.id is not None
    where = f"{spec.text} is {real}" if real is not None else f"{spec.text} is not a token here"
    return f"pinned id {describe_id(tok, spec.id)}; {where}"
