"""The conversations a run still has to ask, as its workers take them: a page of prompts at a
time from the ledger (memory holds one page, not the dataset), each with its stored answers
(a resumed conversation) and its first turn's prompt ids."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from ..config import DatasetCfg
from ..records import Prompt, StoredResponse
from ..store.ledger import Ledger
from ..tokens.sample_maker import TokensStage
from .inputs import first_turn_ids

#: conversations a page holds (those whose first prompts were stored without their ids are
#: rendered in one batched encode)
PROMPT_WINDOW = 512


@dataclass(frozen=True)
class Chain:
    """One conversation still to finish: its prompt, sample, stored answers by turn (a resumed
    conversation), and its first turn's prompt ids where they were rendered ahead."""

    prompt: Prompt
    sample: int
    answers: dict[int, StoredResponse]
    #: an ``array('i')`` as read from the ledger (4 bytes an id, not a list's 36: a page of 512
    #: long prompts held 67 MB of ints), a list as rendered here; a request copies it to a list
    first_ids: Sequence[int] | None = None


def chain_pages(ledger: Ledger, d: DatasetCfg) -> Iterator[list[Chain]]:
    """The conversations with a turn still to ask, PROMPT_WINDOW prompts at a time, each with
    its stored answers where it has some (a resumed conversation)."""
    after = -1
    while True:
        page = ledger.prompts.pending_chains(d.name, after, PROMPT_WINDOW)
        if page.next_after is None:
            return
        after = page.next_after
        if page.chains:
            yield [
                Chain(
                    c.prompt,
                    c.sample,
                    ledger.answers.of_chain(d.name, c.prompt.id, c.sample) if c.answered else {},
                    c.first_ids,
                )
                for c in page.chains
            ]


def first_prompts(tokens: TokensStage, d: DatasetCfg, page: list[Chain]) -> list[Chain]:
    """A page of conversations, each with its first turn's prompt ids where that turn is still
    to ask: those stored with the prompt, else one batched render (the prompt's samples share
    it)."""
    todo = {c.prompt.id: c.prompt for c in page if 0 not in c.answers and not c.first_ids}
    ids = dict(zip(todo, first_turn_ids(tokens, d, list(todo.values())), strict=True))
    return [c if c.prompt.id not in ids else replace(c, first_ids=ids[c.prompt.id]) for c in page]
