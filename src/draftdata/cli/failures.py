"""The closing lines of `generate` and `run` about what failed: the server's own words, whether a
rerun can help, and whether the run ends with an error (a backend that stopped answering)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .app import err, say

if TYPE_CHECKING:
    from ..records import Key
    from ..store.stats import RunStatus

#: statuses a rerun may get past (the server was busy, or asked to wait)
_TRANSIENT = {"http_408", "http_409", "http_429"}


def kind_of(why: str) -> str:
    """'refused' (the server said no to this request: it will again), 'skipped' (never sent),
    'unavailable' (no answer came at all: connection refused or cut, timeouts: the backend is
    down or unreachable) or 'failed' (the server answered with an error after every retry: 429,
    5xx, an unusable body; a rerun asks again)."""
    reason = why.split(":", 1)[0]
    if reason == "over_context" or reason.startswith("unrenderable_prompt"):
        return "skipped"
    if reason.startswith("http_4") and reason not in _TRANSIENT:
        return "refused"
    if reason in ("timeout", "connection_error"):
        return "unavailable"
    return "failed"


def report_failures(
    st: RunStatus, names: Any, manifest: Path, failed: list[tuple[Key, str, str]]
) -> bool:
    """Print what failed for good, with the server's words; True when the run must end with an
    error: a dataset got no answer at all, or its backend stopped answering (connection refused
    or cut, timeouts: a server that died) so that some of its prompts are left to a rerun. A
    server that answered with errors (429, 5xx after every retry) is counted and said, and the
    run ends as before: it was there, and the rest of its answers are good."""
    bad = False
    by_dataset: dict[str, list[str]] = {}
    for key, state, why in failed:
        if state in ("failed", "quarantined"):
            by_dataset.setdefault(key.dataset, []).append(why)
    for name in names:
        d = st.dataset(name)
        whys = by_dataset.get(name, [])
        if not whys:
            continue
        kinds = Counter(kind_of(w) for w in whys)
        first = {k: next(w for w in whys if kind_of(w) == k) for k in kinds}
        see = f"`draftdata status {manifest} --failed` lists them"
        if kinds["skipped"]:
            say(
                err,
                f"{name}: {kinds['skipped']} of {d.total} not sent ({first['skipped']}); {see}",
                "yellow",
            )
        if kinds["refused"]:
            say(
                err,
                f"{name}: {kinds['refused']} of {d.total} refused by the server, not retried "
                f"(a rerun sends them as they are, and they would be refused again): "
                f"{first['refused']}; {see}",
                "bold yellow",
            )
        for kind in ("unavailable", "failed"):
            if kinds[kind]:
                bad = bad or kind == "unavailable"
                say(
                    err,
                    f"{name}: {kinds[kind]} of {d.total} failed after retries "
                    f"({first[kind]}); {d.done} answered; rerunning asks the rest again; {see}",
                    "bold red" if kind == "unavailable" else "bold yellow",
                )
        if d.done == 0 and d.failed:
            bad = True
            if any(w.startswith(("connection_error", "timeout")) for w in whys):
                say(
                    err,
                    "  nothing was answered: is the server at the backend's base_url running "
                    "and reachable? (`draftdata plan` checks before a run)",
                )
    return bad
