"""The prompts a drafter is measured on, each dataset's own: from a run, the prompts of each of
its datasets' sources that the run did not ask (its ledger holds every prompt it read, so none
of them was trained on), rendered as the run renders them (its system message, tools); from a
prompt file, every prompt. A prompt is asked as its first turn."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..records.wire import messages_to_wire


@dataclass(frozen=True)
class EvalSet:
    """One dataset's held-out requests (OpenAI wire messages, and tools where a prompt has
    them), what was left out and why."""

    name: str
    requests: tuple[dict[str, Any], ...]
    source: str
    skipped: dict[str, int]


def _request(p: Any) -> dict[str, Any]:
    from ..tokens.history import turn_messages

    body: dict[str, Any] = {"messages": messages_to_wire(turn_messages(p, "first", 0, ()))}
    if p.tools:
        body["tools"] = [{"type": "function", "function": t} for t in p.tools]
    return body


def from_run(run_dir: Path, limit: int) -> list[EvalSet]:
    """Each dataset of the run: the first ``limit`` prompts of its source the run never read."""
    from ..generate.inputs import iter_dataset
    from ..store.ledger import Ledger
    from ..store.runs import manifest_of_run

    m = manifest_of_run(run_dir)
    ledger = Ledger.read(run_dir / "ledger.sqlite")
    out = []
    try:
        for d in m.datasets:
            used = ledger.prompts.ids_of(d.name)
            skipped: Counter[str] = Counter()
            reqs = []
            for p in iter_dataset(m, d.model_copy(update={"limit": None}), skipped):
                if p.id in used:
                    skipped["in_the_run"] += 1
                    continue
                reqs.append(_request(p))
                if len(reqs) >= limit:
                    break
            out.append(EvalSet(d.name, tuple(reqs), str(m.resolve(d.source)), dict(skipped)))
    finally:
        ledger.close()
    return out


def parse_spec(spec: str) -> tuple[str, str, Path]:
    """``[NAME=]READER:PATH`` -> (name, reader, path); a one-line error naming the form."""
    from ..sources import READERS

    name, _, rest = spec.rpartition("=") if "=" in spec.split(":", 1)[0] else ("", "", spec)
    reader, sep, path = rest.partition(":")
    if not sep or not path:
        raise InputError(
            f"--prompts {spec!r}: give READER:PATH (e.g. mtbench:question.jsonl), or "
            "NAME=READER:PATH"
        )
    if reader not in READERS:
        raise InputError(
            f"--prompts {spec}: no reader {reader!r}; choose one of {', '.join(sorted(READERS))}"
        )
    return name or reader, reader, Path(path)


def from_file(spec: str, limit: int) -> EvalSet:
    """The first ``limit`` prompts of a prompt file, read by its reader."""
    from ..sources import iter_prompts

    name, reader, path = parse_spec(spec)
    if not path.exists():
        raise InputError(f"--prompts {spec}: {path} does not exist")
    skipped: Counter[str] = Counter()
    reqs = []
    for p in iter_prompts(path, reader, name, skipped, {}, None, None):
        if not any(m.role == "user" for m in p.messages):
            skipped["no_user_message"] += 1
            continue
        reqs.append(_request(p))
        if len(reqs) >= limit:
            break
    return EvalSet(name, tuple(reqs), str(path), dict(skipped))


def gather(run: Path | None, prompt_files: list[str], limit: int) -> list[EvalSet]:
    """Every dataset to measure, each with at least one request; one line where one has none."""
    if limit < 1:
        raise InputError(f"--limit {limit}: give at least 1 prompt per dataset")
    sets = (from_run(run, limit) if run is not None else []) + [
        from_file(s, limit) for s in prompt_files
    ]
    if not sets:
        raise InputError(
            "draftdata evaluate: Missing the prompts: give a RUN (its datasets' held-out prompts) "
            "or --prompts READER:PATH; see `draftdata evaluate --help`"
        )
    names = [s.name for s in sets]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(
            f"two prompt sets are named {dup[0]}; name them with --prompts NAME=READER:PATH"
        )
    empty = [s for s in sets if not s.requests]
    if empty:
        s = empty[0]
        why = ", ".join(f"{k} {v}" for k, v in sorted(s.skipped.items())) or "none read"
        raise InputError(
            f"{s.name}: no held-out prompt ({why}): the run asked every prompt of {s.source}; "
            "measure on other prompts with --prompts READER:PATH"
        )
    return sets
