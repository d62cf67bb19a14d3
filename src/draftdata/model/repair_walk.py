"""Repair a reconstructed answer with the target model: at each position, the token the model
could have produced there among those that spell the same text.

The walk (one session per sample, so most samples cost one forward pass): the session is
``Scorer.session`` (a KV cache in this process) or ``ServerScorer.session`` (the server that
serves the target, ``generate.scoring``); the walk reads each position's distribution as a
:class:`~draftdata.model.rows.Row` and decides what could have been drawn with
``rows.in_nucleus``, the same rule for both.

1. The answer's ids are cut into text runs between control ids. Control ids are never changed and
   never candidates; a run's text is its bytes decoded (invalid UTF-8 reads as U+FFFD, as a
   server's decode writes it).
2. At each text position the model's distribution says whether our token could have been
   produced by the decoding that made the answer (:class:`Decoding`): for greedy decoding it must
   be the arg-max (within ``TOLERANCE``), for sampling it must lie inside the top-p nucleus at
   that temperature, within ``NUCLEUS_MARGIN`` (another engine's numbers are not the sampler's). A token that could have been produced is kept, so a repair never moves an
   answer away from a split the model could have written.
3. Where ours could not have been produced, the candidates are the ordinary tokens whose bytes
   continue the run's text (a U+FFFD in the text also accepts the invalid bytes it stands for);
   the most probable one is taken, the rest of the run is encoded again after it, and the model
   goes on from there with the cache of the prefix.

Every change is recorded as a :class:`Repair`. The result spells exactly the same text runs and
control ids as the input, or the input is returned unchanged.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import Decoding, Repair
from ..tokenizers import Tokenizer
from .rows import Nucleus, Row, TargetScorer

__all__ = ["Repair", "RepairResult", "repair_response"]

#: how many of the model's most probable tokens are checked as candidates where the text holds a
#: U+FFFD (the bytes it stands for cannot be read off the text)
TOP_K = 256
#: alternatives compared as paths at one step of a sampled answer, and the longest path compared
MAX_ALTERNATIVES = 3
MAX_PATH = 16
#: paths run through the model in one tree-masked pass
PEEK_BATCH = 64
#: an alternative more than this many tempered logits below the best token is never in a nucleus
#: worth checking
LOGIT_WINDOW = 20.0
#: how much more probable (in nats) the other path must be: sampling does draw the less probable
#: path now and then. On the SmolLM2 dev ground truth every right switch won by >= 1.6 nats and
#: the one wrong switch by 0.5 (DEVELOPERS.md).
PATH_MARGIN = 1.0
#: tokens after the meeting point that both paths are scored on
LOOKAHEAD = 4
#: repairs allowed in one answer; past it the answer is kept as repaired so far (still the same text)
MAX_REPAIRS = 64


@dataclass
class RepairResult:
    response: list[int]
    repairs: list[Repair] = field(default_factory=list)
    #: log p of every answer token under the model, after the repairs
    logprobs: list[float] = field(default_factory=list)
    #: log p of each prompt token after the first (the prompt is never changed)
    prompt_logprobs: list[float] = field(default_factory=list)
    forwards: int = 0
    tokens_forwarded: int = 0
    #: why the walk gave up and kept the input (empty when it finished)
    abandoned: str = ""
    #: the margin (nats) of each switch made where ours could have been drawn too: a bet, wrong
    #: with probability 1 / (1 + e^margin) when the numbers are the sampling engine's
    bets: list[float] = field(default_factory=list)


@dataclass
class Proposal:
    """Another spelling at position ``i``: the path scored against ours, and the run's new ids."""

    i: int
    b: int
    path: list[int]
    new_tail: list[int]
    ours_q: float
    theirs_q: float
    repair: Repair


def split_decode(data: bytes) -> tuple[str, bytes]:
    """Decode ``data`` as a stream: the text so far, and the bytes of an unfinished character."""
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = dec.decode(data, final=False)
    return text, dec.getstate()[0]


def consistent(done: bytes, piece: bytes, text: str) -> bool:
    """Whether ``done + piece`` can still decode to ``text`` with more bytes after it."""
    stable, pending = split_decode(done + piece)
    if not text.startswith(stable):
        return False
    if not pending:
        return True
    rest = text[len(stable) :]
    return bool(rest) and (rest[0] == "\ufffd" or rest[0].encode().startswith(pending))


class Walk:
    """The state of one answer's repair (see the module docstring)."""

    def __init__(
        self,
        scorer: TargetScorer,
        tok: Tokenizer,
        prompt_ids: Sequence[int],
        response: Sequence[int],
        finish_reason: str,
        decoding: Decoding,
        encode_rest: Callable[[str, bool], list[int]],
    ) -> None:
        self.tok = tok
        self.P = len(prompt_ids)
        self.finish = finish_reason
        self.decoding = decoding
        self.encode_rest = encode_rest
        self.by_bytes = tok.ordinary_ids_by_bytes
        self.longest = max((len(b) for b in self.by_bytes), default=1)
        self.session = scorer.session(list(prompt_ids) + list(response), self.P)
        self.response = list(response)
        self.repairs: list[Repair] = []
        self.bets: list[float] = []
        self._nuclei: dict[int, Nucleus] = {}
        #: an unknown decoding is read as greedy
        self.greedy = decoding.temperature is None or decoding.greedy

    # --- what could have been produced --------------------------------------------------
    def possible(self, start: int) -> list[bool]:
        """For each answer position from ``start``: could the decoding have produced our id?"""
        return self.session.possible(self.P + start, self.decoding, self.greedy)

    # --- runs of text -------------------------------------------------------------------
    def run_of(self, i: int) -> tuple[int, int]:
        ctrl = self.tok.control_ids
        a = i
        while a > 0 and self.response[a - 1] not in ctrl:
            a -= 1
        b = i
        while b < len(self.response) and self.response[b] not in ctrl:
            b += 1
        return a, b

    def run_at(self, i: int, run: tuple[int, int, str] | None) -> tuple[int, int, str]:
        """``(start, end, text)`` of the text run holding position ``i`` (``run`` if it does)."""
        if run is not None and run[0] <= i < run[1]:
            return run
        a, b = self.run_of(i)
        return a, b, self.data(self.response[a:b]).decode("utf-8", errors="replace")

    def data(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.tok.token_bytes(t) for t in ids)

    def candidates(self, done: bytes, text: str, row: Row) -> list[int]:
        found: set[int] = set()
        stable, pending = split_decode(done)
        if not pending and text.startswith(stable):
            rest = text[len(stable) :].encode()
            for n in range(1, min(self.longest, len(rest)) + 1):
                t = self.by_bytes.get(rest[:n])
                if t is not None:
                    found.add(t)
        if "\ufffd" in text:
            ctrl = self.tok.control_ids
            for t in row.topk(TOP_K):
                if t not in ctrl and t < self.tok.vocab_size:
                    try:
                        piece = self.tok.token_bytes(t)
                    except Exception:  # a hole in the vocabulary
                        continue
                    if piece and consistent(done, piece, text):
                        found.add(t)
        return sorted(found)

    def asked(
        self, row: Row, cands: Sequence[int], beat: float | None, nucleus: Nucleus | None = None
    ) -> list[int]:
        """The candidates whose log p could change the decision, each asked for at once (a server
        row asks one request per token it does not know): one the row does not know is left out
        where its log p cannot pass ``beat`` (it is at most the row's ceiling), or where every
        such token lies outside ``nucleus``."""
        ceiling = row.ceiling()
        keep = [
            c
            for c in cands
            if row.has(c)
            or not (
                (beat is not None and ceiling <= beat)
                or (nucleus is not None and nucleus.unknown_outside())
            )
        ]
        row.need(keep)
        return keep

    # --- the walk -----------------------------------------------------------------------
    def run(self) -> RepairResult:
        original = list(self.response)
        ctrl = self.tok.control_ids
        i = 0
        ok = self.possible(0)
        run: tuple[int, int, str] | None = None
        switch: Proposal | None = None
        scanned = False
        while i < len(self.response) and len(self.repairs) < MAX_REPAIRS:
            t = self.response[i]
            if t in ctrl:
                i += 1
                continue
            run = self.run_at(i, run)
            a, b, text = run
            if ok[i] and self.greedy:
                i += 1
                continue
            if ok[i]:
                # sampled, and ours could have been drawn: switch only where another spelling of
                # the same text is more probable as a path, by PATH_MARGIN (``scan``)
                if not scanned:
                    switch, scanned = self.scan(i, ok), True
                changed: bool | None = False
                if switch is not None and switch.i == i:
                    self.change(i, switch.b, switch.new_tail, switch.repair)
                    if switch.ours_q > -math.inf:
                        self.bets.append(switch.theirs_q - switch.ours_q)
                    changed = True
            else:
                done = self.data(self.response[a:i])
                changed = self.most_probable(i, b, done, text, self.session.row(self.P + i))
            if changed is None:
                return self.result(original, "no_tail")
            if changed:
                run, switch, scanned = None, None, False
                ok = ok[:i] + self.possible(i)
            i += 1
        if not self.same_text(original):
            return self.result(original, "text_changed")
        return self.result(self.response, "")

    def most_probable(self, i: int, b: int, done: bytes, text: str, row: Row) -> bool | None:
        """Ours could not have been produced: take the most probable consistent token."""
        t = self.response[i]
        cands = self.asked(row, self.candidates(done, text, row), row.lp(t)) or [t]
        best = max(cands, key=row.lp)
        if best == t or row.lp(best) <= row.lp(t):
            return False
        tail = self.tail(done + self.tok.token_bytes(best), text, b)
        if tail is None:
            return None
        self.change(i, b, [best, *tail], Repair(i, t, best, row.lp(t), row.lp(best)))
        return True

    def scan(self, i0: int, ok: Sequence[bool]) -> Proposal | None:
        """The first position from ``i0`` (up to the next one that must change anyway) where
        another spelling of the text is more probable than ours as a path under the sampling
        distribution: up to where the two spellings meet again at the same byte, plus
        ``LOOKAHEAD`` of our tokens after that. Every path worth checking (its first step alone
        beats ours) runs through the model in one pass with a tree mask (``Session.peek_many``)."""
        ctrl = self.tok.control_ids
        proposals: list[Any] = []
        k = i0
        run: tuple[int, int, str] | None = None
        while k < len(self.response):
            t = self.response[k]
            if t in ctrl:
                k += 1
                continue
            run = self.run_at(k, run)
            a, b, text = run
            if not ok[k]:
                # a token the decoding could not have drawn: the walk will change it there if
                # another spelling is more probable; if none is, it stays, and a path that
                # runs into it is rightly scored -inf
                row = self.session.row(self.P + k)
                done = self.data(self.response[a:k])
                cands = self.asked(row, self.candidates(done, text, row), row.lp(t))
                if any(row.lp(c) > row.lp(t) for c in cands if c != t):
                    break
            else:
                proposals.append((k, a, b, text))
            k += 1
        # ``k`` is now the first position that must change anyway: no path is scored past it.
        # Positions are proposed in order, PEEK_BATCH proposals at a time, and the first batch
        # holding a winner gives the first winner: nothing is asked past it (a server asks per
        # position, and after a change the rest is asked again)
        batch: list[Proposal] = []
        for n, (k0, a, b, text) in enumerate(proposals):
            batch += self.proposals(k0, a, b, text, k)
            if len(batch) < PEEK_BATCH and n < len(proposals) - 1:
                continue
            self.check_paths([p for p in batch if len(p.path) > 1])
            won = [p for p in batch if p.theirs_q > p.ours_q + PATH_MARGIN]
            if won:
                return min(won, key=lambda p: p.i)
            batch = []
        return None

    def check_paths(self, need: Sequence[Proposal]) -> None:
        """Add each path's later steps to its ``theirs_q`` (one ``peek_many``). Every step adds a
        q <= 0, so a path that falls to ours + PATH_MARGIN cannot win: a session that asks step
        by step stops it there, and it is scored -inf (the same choices)."""

        def theirs(n: int, rows: Sequence[Row]) -> float:
            path = need[n].path
            return need[n].theirs_q + sum(self.nucleus(r).q(path[j]) for j, r in enumerate(rows, 1))

        rows = self.session.peek_many(
            [(self.P + p.i, p.path) for p in need],
            lambda n, r: theirs(n, r) > need[n].ours_q + PATH_MARGIN,
        )
        for n, (p, r) in enumerate(zip(need, rows, strict=True)):
            p.theirs_q = theirs(n, r) if len(r) == len(p.path) - 1 else -math.inf

    def proposals(self, i: int, a: int, b: int, text: str, end: int) -> list[Proposal]:
        t = self.response[i]
        row = self.session.row(self.P + i)
        done = self.data(self.response[a:i])
        top = row.top()
        temp = float(self.decoding.temperature or 1.0)
        here = self.nucleus_at(i)
        # a token more than LOGIT_WINDOW below the top, or outside the nucleus, is no proposal;
        # nor is one whose q cannot beat the least our path can score by PATH_MARGIN (ours_q
        # below sums q <= 0 over at most MAX_PATH + LOOKAHEAD - 1 of our next tokens)
        last = min(b, end, i + MAX_PATH + LOOKAHEAD)
        floor = here.q(t) + sum(self.nucleus_at(k).q(self.response[k]) for k in range(i + 1, last))
        beat = max(top - LOGIT_WINDOW * temp, here.lp_reaching(floor + PATH_MARGIN))
        cands = [c for c in self.candidates(done, text, row) if c != t]
        alts = [
            c for c in self.asked(row, cands, beat, here) if (top - row.lp(c)) / temp < LOGIT_WINDOW
        ]
        if not alts:
            return []
        out: list[Proposal] = []
        ours = self.response[i:b]
        for c in sorted(alts, key=lambda c: -here.q(c))[:MAX_ALTERNATIVES]:
            first = here.q(c)
            if first == -math.inf:
                continue
            tail = self.tail(done + self.tok.token_bytes(c), text, b)
            if tail is None:
                continue
            theirs = [c, *tail]
            meet = self.meeting(ours, theirs)
            if meet is None:
                continue
            ka, kb = meet
            if i + ka > end:
                continue
            # both paths go on with our next tokens: how probable those are after each
            # spelling is part of the evidence ("\n" "\n" then "1" is not "\n\n" then "1")
            after = self.response[i + ka : min(i + ka + LOOKAHEAD, b, end)]
            ours_q = here.q(t) + sum(
                self.nucleus_at(i + k).q(self.response[i + k]) for k in range(1, ka + len(after))
            )
            # every later step of their path adds a q <= 0, so a first step that does not beat
            # ours by PATH_MARGIN cannot win as a path: it is never checked (the same choices)
            if first <= ours_q + PATH_MARGIN:
                continue
            out.append(
                Proposal(
                    i=i,
                    b=b,
                    path=[*theirs[:kb], *after],
                    new_tail=[*theirs[:kb], *ours[ka:]],
                    ours_q=ours_q,
                    theirs_q=first,
                    repair=Repair(i, t, c, row.lp(t), row.lp(c)),
                )
            )
        return out

    def meeting(self, ours: Sequence[int], theirs: Sequence[int]) -> tuple[int, int] | None:
        """The first (k_ours, k_theirs) at which both spellings have consumed the same bytes."""
        seen: dict[int, int] = {}
        n = 0
        for k, tok in enumerate(ours[:MAX_PATH]):
            n += len(self.tok.token_bytes(tok))
            seen[n] = k + 1
        n = 0
        for k, tok in enumerate(theirs[:MAX_PATH]):
            n += len(self.tok.token_bytes(tok))
            if n in seen:
                return seen[n], k + 1
        return None

    def nucleus(self, row: Row) -> Nucleus:
        return row.nucleus(self.decoding)

    def nucleus_at(self, i: int) -> Nucleus:
        """The nucleus at answer position ``i`` of the current ids (kept until they change)."""
        if i not in self._nuclei:
            self._nuclei[i] = self.nucleus(self.session.row(self.P + i))
        return self._nuclei[i]

    def change(self, i: int, b: int, new_run_tail: list[int], repair: Repair) -> None:
        self._nuclei = {k: v for k, v in self._nuclei.items() if k <= i}
        self.repairs.append(repair)
        self.response = [*self.response[:i], *new_run_tail, *self.response[b:]]
        self.session.replace_from(self.P + i, self.response[i:])

    def tail(self, done: bytes, text: str, run_end: int) -> list[int] | None:
        """The ids that spell the rest of the run after ``done``."""
        stable, pending = split_decode(done)
        if not text.startswith(stable):
            return None
        rest = text[len(stable) :]
        head: list[int] = []
        if pending:
            if not rest:
                return None
            if rest[0] == "\ufffd":
                rest = rest[1:]  # the next character's first byte ends the invalid sequence
            elif rest[0].encode().startswith(pending):
                more = rest[0].encode()[len(pending) :]
                one = self.by_bytes.get(more)
                head = [one] if one is not None else [self.by_bytes[bytes([c])] for c in more]
                rest = rest[1:]
            else:
                return None
        open_end = self.finish == "length" and run_end == len(self.response)
        return head + (self.encode_rest(rest, open_end) if rest else [])

    def same_text(self, original: Sequence[int]) -> bool:
        ctrl = self.tok.control_ids

        def shape(ids: Sequence[int]) -> list[Any]:
            out: list[Any] = []
            run: list[int] = []
            for t in ids:
                if t in ctrl:
                    out += [self.data(run).decode("utf-8", errors="replace"), t]
                    run = []
                else:
                    run.append(t)
            return [*out, self.data(run).decode("utf-8", errors="replace")]

        return shape(original) == shape(self.response)

    def result(self, response: list[int], abandoned: str) -> RepairResult:
        s = self.session
        if abandoned:
            self.repairs, self.bets = [], []
            if s.ids[self.P :] != response:
                s.replace_from(self.P, response)
        lps = s.logprobs()
        return RepairResult(
            response=response,
            repairs=self.repairs,
            logprobs=lps,
            prompt_logprobs=s.prefix_logprobs,
            forwards=s.forwards,
            tokens_forwarded=s.tokens_forwarded,
            abandoned=abandoned,
            bets=self.bets,
        )


def repair_response(
    scorer: TargetScorer,
    tok: Tokenizer,
    prompt_ids: Sequence[int],
    response: Sequence[int],
    finish_reason: str,
    decoding: Decoding,
    encode_rest: Callable[[str, bool], list[int]],
) -> RepairResult:
    """Repair one reconstructed answer (see the module docstring). ``encode_rest(text, open_end)``
    encodes the rest of a run the way reconstruction does (``open_end`` for a truncated answer's
    last text)."""
    if not response:
        return RepairResult(response=[])
    return Walk(scorer, tok, prompt_ids, response, finish_reason, decoding, encode_rest).run()
