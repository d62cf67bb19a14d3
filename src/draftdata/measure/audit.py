"""Special-token audit: are the format's markers what the tokenizer says they are, and do real
outputs end with the end-of-turn marker? Pure functions over a tokenizer, a format and records."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..formats import BoundFormat, ChatFormat, describe_id
from ..tokenizers import Tokenizer
from ..version import __version__

#: how many examples each confusable list keeps
EXAMPLES = 12


@dataclass(frozen=True)
class ExpectVerdict:
    name: str
    expected: int
    actual: int | None
    ok: bool
    message: str


@dataclass(frozen=True)
class DataCheck:
    records: int
    finished: int
    truncated: int
    end_id: int
    end_text: str
    finished_ending_with_end: int
    truncated_ending_with_end: int
    last_token_histogram: list[dict[str, Any]]
    ok: bool
    message: str


@dataclass
class AuditReport:
    tokenizer: dict[str, Any]
    format: dict[str, Any]
    markers: list[dict[str, Any]]
    confusables: dict[str, Any]
    expectations: list[ExpectVerdict] = field(default_factory=list)
    data: DataCheck | None = None
    draftdata_version: str = __version__

    @property
    def failures(self) -> list[str]:
        out = [f"marker {m['name']}: {m['problem']}" for m in self.markers if m["problem"]]
        out += [e.message for e in self.expectations if not e.ok]
        if self.data is not None and not self.data.ok:
            out.append(self.data.message)
        return out

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["failures"] = self.failures
        return d


def audit(
    tokenizer: Tokenizer,
    fmt: ChatFormat,
    *,
    expect: Mapping[str, int] | None = None,
    records: Iterable[Mapping[str, Any]] | None = None,
) -> AuditReport:
    bound = fmt.bind(tokenizer, strict=False)
    markers = [
        {
            **asdict(c),
            "ok": c.ok,
            "stock_encode_matches_in_user_text": _stock_matches(tokenizer, c.text, c.id),
        }
        for c in bound.checks
    ]
    report = AuditReport(
        tokenizer={
            "path": str(tokenizer.path),
            "kind": tokenizer.kind,
            "sha256": tokenizer.sha256,
            "vocab_size": tokenizer.vocab_size,
            "special_tokens": sum(
                1 for t in tokenizer.control_tokens.values() if t.kind == "special"
            ),
            "added_tokens": sum(1 for t in tokenizer.control_tokens.values() if t.kind == "added"),
            "unrepresentable_bytes": sorted(tokenizer.unrepresentable_bytes),
            "chat_template_sha256": tokenizer.chat_template_sha256,
            "encoder": tokenizer.encoder,
        },
        format={
            "name": fmt.name,
            "version": fmt.version,
            "description": fmt.description,
            "end_of_turn": fmt.end_of_turn,
            "end_of_turn_id": bound.ids.get(fmt.end_of_turn),
        },
        markers=markers,
        confusables=confusables(tokenizer, bound),
    )
    for name, value in (expect or {}).items():
        report.expectations.append(check_expectation(bound, name, value))
    if records is not None:
        report.data = check_data(bound, records)
    return report


def _stock_matches(tok: Tokenizer, text: str, token_id: int | None) -> bool:
    """Would the stock encode turn this text, typed inside a user's message, into the token?"""
    return token_id is not None and token_id in tok.encode_as_stock(f"a{text}b")


def check_expectation(bound: BoundFormat, name: str, value: int) -> ExpectVerdict:
    fmt, tok = bound.format, bound.tokenizer
    key = name
    if key not in fmt.markers:  # allow the marker's text too: --expect '<|im_end|>=163586'
        key = next((n for n, m in fmt.markers.items() if m.text == name), name)
    spec = fmt.markers.get(key)
    if spec is None:
        return ExpectVerdict(
            name,
            value,
            None,
            False,
            f"--expect {name}: no marker of that name in format {fmt.name}; "
            f"known: {', '.join(fmt.markers)}",
        )
    info = tok.control_by_text.get(spec.text)
    actual = info.id if info else None
    if actual == value:
        return ExpectVerdict(
            name, value, actual, True, f"{name}={value}: correct, {spec.text} is {value}"
        )
    real = f"{spec.text} is {actual}" if actual is not None else f"{spec.text} is not a token here"
    return ExpectVerdict(name, value, actual, False, f"{describe_id(tok, value)}; {real}")


def confusables(tok: Tokenizer, bound: BoundFormat) -> dict[str, Any]:
    marker_texts = {c.text for c in bound.checks}
    # the bracket characters of each marker ('<', '|', '>', '｜', '/'): a look-alike has one
    brackets = {
        t: {ch for ch in t[:2] + t[-2:] if not ch.isalnum() and ch != "_"} for t in marker_texts
    }
    lookalike: dict[str, list[dict[str, Any]]] = defaultdict(list)
    counts: Counter[str] = Counter()
    by_bytes: dict[bytes, list[int]] = defaultdict(list)
    control = tok.control_tokens
    for tid in range(tok.vocab_size):
        try:
            raw = tok.token_bytes(tid)
        except Exception:  # holes in a vocabulary (unused ids)
            continue
        by_bytes[raw].append(tid)
        if tid in control:
            continue
        text = raw.decode("utf-8", errors="ignore")
        core = text.strip()
        if len(core) < 2:
            continue
        for mt in marker_texts:
            if core in mt and any(ch in brackets[mt] for ch in core):
                counts[mt] += 1
                if len(lookalike[mt]) < EXAMPLES:
                    lookalike[mt].append({"id": tid, "text": text})
    same_text = [
        {
            "text": raw.decode("utf-8", errors="backslashreplace"),
            "ids": ids,
            "kinds": [tok.kind_of(i) for i in ids],
        }
        for raw, ids in by_bytes.items()
        if len(ids) > 1
    ]
    added_in_text = [
        {"id": t.id, "text": t.text}
        for t in sorted(control.values(), key=lambda t: t.id)
        if t.kind == "added" and _stock_matches(tok, t.text, t.id)
    ]
    multi = [
        {"name": c.name, "text": c.text, "stock_ids": tok.encode_as_stock(c.text)}
        for c in bound.checks
        if not c.encodes_to_one
    ]
    return {
        "ordinary_lookalikes": {
            mt: {"count": counts[mt], "examples": lookalike[mt]}
            for mt in sorted(marker_texts)
            if counts[mt]
        },
        "added_tokens_matched_in_text": added_in_text,
        "same_text_ids": same_text[:EXAMPLES],
        "same_text_id_groups": len(same_text),
        "markers_encoding_to_several_ids": multi,
    }


def check_data(bound: BoundFormat, records: Iterable[Mapping[str, Any]]) -> DataCheck:
    tok = bound.tokenizer
    end_id = bound.ids.get(bound.format.end_of_turn, -1)
    stops = bound.stop_ids
    last: Counter[int] = Counter()
    n = finished = truncated = fin_end = trunc_end = 0
    for r in records:
        ids = r.get("output_ids") or []
        n += 1
        if not ids:
            continue
        if r.get("finish_reason") == "length":
            truncated += 1
            trunc_end += ids[-1] in stops
            continue
        finished += 1
        last[ids[-1]] += 1
        fin_end += ids[-1] in stops
    hist = [
        {
            "id": i,
            "text": tok.token_str(i) if 0 <= i < tok.vocab_size else "?",
            "kind": tok.kind_of(i),
            "count": c,
            "is_end_of_turn": i in stops,
        }
        for i, c in last.most_common(10)
    ]
    end_text = bound.format.markers[bound.format.end_of_turn].text
    ok = finished > 0 and fin_end == finished
    if finished == 0:
        msg = "no finished outputs in --data (every record was truncated or empty)"
    elif ok:
        msg = f"all {finished} finished outputs end with {end_id} ({end_text})"
    else:
        top = last.most_common(1)[0][0]
        msg = (
            f"{finished - fin_end} of {finished} finished outputs do not end with the "
            f"format's end of turn {end_id} ({end_text}); most common last token: "
            f"{describe_id(tok, top)}"
        )
    return DataCheck(n, finished, truncated, end_id, end_text, fin_end, trunc_end, hist, ok, msg)
