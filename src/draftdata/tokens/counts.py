"""The count witness: a server's own token counts, held against every sample's ids.

Every OpenAI-compatible answer carries ``usage``: the prompt and completion tokens the server
counted (and, some, the reasoning tokens). These are the server's numbers, not draftdata's, so
an answer whose text lost or gained a token on its way (a newline a parser stripped before
``</think>``, a missing end marker, a template suffix, a special id written as text) shows it
here even where the text cannot. Each server counts in its own way (``records.Counting``, one
per server profile: is the end marker counted, is a prefilled think opener counted as
completion, does it add a BOS); a run checks that convention on the answers that came with
the server's own ids (``fit``) and uses what they show.

A sample whose ids do not add up to the server's counts carries the label ``count_mismatch``
(what ``[run] drop``, ``export --drop``, the report and the gate count) and its detail,
``count_mismatch:<part><ours - the server's>[@<where>] (<part>: ids N, server M)``, both
numbers in the parentheses (``status`` counts the detail without them):
``completion-1@think_close`` is one token short of the server's count in an answer with a
think close (the place a stripped newline is most often lost), ``prompt+1`` one more prompt id
than the server fed its model.
``@end_marker`` is a difference of one in an answer that ended (its end marker, or a template
suffix). The label is counted per dataset (``status``, the report), can be dropped
(``[run] drop = ["count_mismatch"]``), and stops a text-only dataset past ``[run]
max_count_mismatch`` (``generate.count_watch``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import product

from ..config import Manifest
from ..formats import BoundFormat
from ..records import ApiView, Counting, Usage
from ..records.servers import profile
from ..store.meta import COUNTING, Meta

__all__ = [
    "LABEL",
    "Shape",
    "after_repair",
    "checked_counting",
    "counting_of",
    "fit",
    "label",
    "server_key",
    "shape_of",
    "witness",
]

#: the label's name (what ``[run] drop`` and the gate count)
LABEL = "count_mismatch"
#: the reasoning rules ``fit`` tries: what ``reasoning_tokens`` counts of the think span
REASONING_RULES = ("inner", "with_close", "with_markers")


@dataclass(frozen=True)
class Shape:
    """A sample as the counts see it: its prompt and answer lengths, whether it ended with a
    stop id, whether its prompt ends with a prefilled think opener, and its think span."""

    prompt: int
    completion: int
    ended: bool
    opener_prefilled: bool
    #: ids between the think markers (None: no think span), and whether it is closed
    think_inner: int | None
    think_closed: bool


def shape_of(bound: BoundFormat, ids: Sequence[int], prompt_len: int) -> Shape:
    """``ids`` (prompt then answer, ``prompt_len`` of them the prompt) as a Shape."""
    opener, close = bound.ids.get("think_open"), bound.ids.get("think_close")
    answer = ids[prompt_len:]
    ended = bool(answer) and answer[-1] in bound.stop_ids
    prefilled = opener is not None and prompt_len > 0 and ids[prompt_len - 1] == opener
    inner: int | None = None
    closed = False
    if opener is not None:
        start = prompt_len - 1 if prefilled else _index(answer, opener, prompt_len)
        if start is not None:
            end = _index(answer, close, prompt_len) if close is not None else None
            closed = end is not None
            stop = end if end is not None else len(ids) - int(ended)
            inner = max(stop - start - 1, 0)
    return Shape(prompt_len, len(answer), ended, prefilled, inner, closed)


def _index(answer: Sequence[int], marker: int | None, offset: int) -> int | None:
    """Where ``marker`` first is in ``answer``, as an index of the whole sequence (C speed:
    a run's every answer is scanned)."""
    try:
        return offset + answer.index(marker)
    except ValueError:
        return None


def expected(shape: Shape, c: Counting) -> tuple[int | None, tuple[int, ...], int | None]:
    """What a server counting as ``c`` says of a sample of ``shape``: its prompt tokens (None:
    not known), the completion counts it may give (two where the convention does not say
    whether the end marker is counted) and its reasoning tokens (None: not known)."""
    moved = int(c.think_opener_in_completion and shape.opener_prefilled)
    prompt = None if c.prompt_extra is None else shape.prompt + c.prompt_extra - moved
    ends = (True, False) if c.end_marker is None else (c.end_marker,)
    completion = tuple(
        sorted({shape.completion - int(shape.ended and not end) + moved for end in ends})
    )
    reasoning = None
    if c.reasoning is not None and shape.think_inner is not None:
        closed = int(shape.think_closed)
        extra = {"inner": 0, "with_close": closed, "with_markers": 1 + closed}[c.reasoning]
        reasoning = shape.think_inner + extra
    return prompt, completion, reasoning


def label(shape: Shape, usage: Usage, c: Counting) -> str | None:
    """The ``count_mismatch`` label's detail where ``usage`` disagrees with ``shape`` counted
    as ``c``; None where every count it gives agrees."""
    prompt, completions, reasoning = expected(shape, c)
    diffs: list[tuple[str, int, int]] = []
    if usage.prompt_tokens is not None and prompt is not None and usage.prompt_tokens != prompt:
        diffs.append(("prompt", prompt, usage.prompt_tokens))
    off = None
    ct = usage.completion_tokens
    if ct is not None and ct not in completions:
        ours = min(completions, key=lambda x: abs(x - ct))
        off = ours - ct
        diffs.append(("completion", ours, ct))
    rt = usage.reasoning_tokens
    if reasoning is not None and rt is not None and rt != reasoning and off is None:
        diffs.append(("reasoning", reasoning, rt))
    if not diffs:
        return None
    where = ""
    if off is not None and shape.think_closed:
        where = "think_close"
    elif off is not None and abs(off) == 1 and shape.ended:
        where = "end_marker"
    return _detail(diffs, where)


def _detail(diffs: Sequence[tuple[str, int, int]], where: str) -> str:
    """The label's detail, written in one place: each count that differs as (part, ours, the
    server's), and where a completion difference sits (``think_close``, ``end_marker``, "")."""
    parts = ",".join(f"{p}{ours - theirs:+d}" for p, ours, theirs in diffs)
    figures = "; ".join(f"{p}: ids {ours}, server {theirs}" for p, ours, theirs in diffs)
    return f"{LABEL}:{parts}{'@' + where if where else ''} ({figures})"


#: one count of a detail's figures, as ``_detail`` writes it
_FIGURE = re.compile(r"(\w+): ids (\d+), server (\d+)")


def server_key(m: Manifest, backend: str) -> str:
    """What a convention checked on a server's own ids is kept under: its base URL, so that a
    text-only backend on the same server (``token_ids = "never"``) is counted as its ids
    showed; a backend with no URL by its name."""
    url = getattr(m.backends.get(backend), "base_url", None)
    return str(url).rstrip("/") if url else backend


def checked_counting(meta: Meta, m: Manifest, backend: str) -> Counting | None:
    """The convention the run checked on the own ids of ``backend``'s server (``fit``, kept by
    ``pipeline.check_counting``); None where it checked none (the profile's is used)."""
    return meta.get(COUNTING.of(server_key(m, backend)))


def counting_of(view: ApiView, override: Counting | None = None) -> Counting:
    """The convention an answer is counted by: the run's (checked on its server's own ids)
    where it has one, else its server profile's."""
    return override if override is not None else profile(view.server).counting


def witness(
    bound: BoundFormat,
    ids: Sequence[int],
    prompt_len: int,
    view: ApiView,
    override: Counting | None = None,
) -> tuple[str, ...]:
    """The warnings for a sample of ``ids`` made from ``view``: ``count_mismatch`` and the
    detail (``count_mismatch:completion-1@think_close``); none where it agrees, or where the
    view carries no counts."""
    if view.usage is None:
        return ()
    got = label(shape_of(bound, ids, prompt_len), view.usage, counting_of(view, override))
    return (LABEL, got) if got else ()


def after_repair(warnings: Sequence[str], grown: int) -> tuple[str, ...]:
    """A sample's warnings once a repair changed its answer by ``grown`` ids: the completion
    count its label held against the server's is moved by as much, and the label goes where
    the counts now agree (two repairs that merge ``"\n" "\n"`` into ``"\n\n"`` make a
    ``completion+2`` answer count as its server did). A label for its prompt or reasoning
    stays as it was."""
    if not grown or LABEL not in warnings:
        return tuple(warnings)
    out: list[str] = []
    for w in warnings:
        diffs = _FIGURE.findall(w) if w.startswith(LABEL + ":") else []
        if not any(p == "completion" for p, _, _ in diffs):
            out.append(w)
            continue
        where = w.split(" (", 1)[0].partition("@")[2]
        moved = [(p, int(o) + grown * (p == "completion"), int(t)) for p, o, t in diffs]
        left = [(p, o, t) for p, o, t in moved if o != t]
        off = next((o - t for p, o, t in left if p == "completion"), None)
        if off is None or (where == "end_marker" and abs(off) != 1):
            where = ""  # where it was is where the completion differed
        if left:
            out.append(_detail(left, where))
    if not any(w.startswith(LABEL + ":") for w in out):
        out.remove(LABEL)
    return tuple(out)


@dataclass(frozen=True)
class Fit:
    """The convention the answers with ids show, how many of them it explains, and of how
    many; ``declared`` is the profile's, and whether it explains as many."""

    counting: Counting
    agree: int
    n: int
    declared: Counting
    declared_agree: int

    @property
    def differs(self) -> bool:
        """The answers show another convention than the profile declares (it explains more)."""
        return self.agree > self.declared_agree

    def line(self, server: str) -> str:
        """One line on what the run checked."""
        said = f"{self.agree} of {self.n} answers"
        if self.differs:
            return (
                f"{server}: its own ids show another counting convention than its profile "
                f"declares: {self.counting.describe()} agrees on {said}, the declared one "
                f"({self.declared.describe()}) on {self.declared_agree}; the run counts its "
                "text answers as its ids show"
            )
        how = (
            f"as declared ({self.declared.describe()})"
            if self.counting == self.declared
            else f"as {self.counting.describe()} (what its profile leaves open, told by its ids)"
        )
        return f"{server}: its token counts agree with its own ids on {said}, counted {how}"


def fit(observed: Iterable[tuple[Shape, Usage]], declared: Counting) -> Fit | None:
    """The convention that explains most of ``observed`` (engine answers: the server's own ids
    and its counts), the declared one where it explains as many; None where none carry
    counts."""
    obs = [(s, u) for s, u in observed]
    if not obs:
        return None

    def agree(c: Counting) -> int:
        return sum(label(s, u, c) is None for s, u in obs)

    # every definite convention, the declared one's definite values first: the first of the
    # most that explain the answers (an unknown part of the declared one is narrowed to what
    # the ids show; a definite one is kept on a tie)
    first = replace(
        declared,
        end_marker=True if declared.end_marker is None else declared.end_marker,
        prompt_extra=declared.prompt_extra or 0,
        reasoning=None,
    )
    tried = [first] + [
        replace(first, end_marker=end, think_opener_in_completion=opener, prompt_extra=extra)
        for end, opener, extra in product((True, False), (False, True), (0, 1, -1))
    ]
    best = max(tried, key=agree)
    if agree(best) < agree(replace(declared, reasoning=None)):
        best = replace(declared, reasoning=None)  # no definite one explains as much
    best = replace(best, reasoning=declared.reasoning)
    # the reasoning rule, where the answers report reasoning tokens
    if any(u.reasoning_tokens is not None and s.think_inner is not None for s, u in obs):
        # a rule is taken only where it explains every reasoning count the rest agrees on
        plain_agree = agree(replace(best, reasoning=None))
        rules = [replace(best, reasoning=r) for r in REASONING_RULES]
        ruled = max(rules, key=agree)
        best = ruled if agree(ruled) == plain_agree else replace(best, reasoning=None)
    return Fit(best, agree(best), len(obs), declared, agree(declared))
