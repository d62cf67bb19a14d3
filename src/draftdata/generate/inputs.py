"""The run's inputs as the manifest names them: the target's tokenizer bound to its format, and
each dataset's prompts as the model will see them. `generate`, `run` and `plan` read them here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet

from ..config import DatasetCfg, Manifest
from ..errors import DraftdataError, GenerateError
from ..measure.contamination import Detector, Tally
from ..records import Message, Prompt
from ..sources import iter_prompts
from ..store.ledger import Ledger
from ..store.stats import status
from ..tokens.history import turn_messages
from ..tokens.sample_maker import TokensStage
from .requests import tools_as_system, with_system


def read_dataset(m: Manifest, d: DatasetCfg) -> tuple[list[Prompt], Counter[str]]:
    """The dataset's prompts (tool schemas moved into the system prompt where it says so),
    and what was skipped while reading, by reason."""
    drops: Counter[str] = Counter()
    return list(iter_dataset(m, d, drops)), drops


def iter_dataset(m: Manifest, d: DatasetCfg, drops: Counter[str]) -> Iterator[Prompt]:
    """``read_dataset`` one prompt at a time; what was skipped is counted in ``drops``."""
    it = iter_prompts(
        m.resolve(d.source), d.reader, d.name, drops, d.columns, d.limit, d.max_prompt_chars
    )
    it = _answerable(it, drops)
    if d.system is not None:
        it = (with_system(p, d.system) for p in it)
    return (tools_as_system(p) for p in it) if d.tools_prompt == "system" else it


#: the drop reason of a prompt an earlier dataset of the run already holds
DUPLICATE = "duplicate_across_datasets"


def drop_reason(
    p: Prompt, earlier: AbstractSet[str], det: Detector | None, tally: Tally | None = None
) -> str | None:
    """Why the run drops a prompt it read, before asking it (None: kept): one an earlier dataset
    holds is ``DUPLICATE``; one ``[run] decontaminate`` flags is ``contaminated:<set>`` (each
    prompt checked goes into ``tally``). ``Runner.prompts`` drops by it, and ``plan`` counts."""
    if p.id in earlier:
        return DUPLICATE
    if det is None:
        return None
    hit = det.check_prompt(p)
    if tally is not None:
        tally.add(p.id, hit)
    return None if hit is None else f"contaminated:{hit.eval_set}"


def _answerable(prompts: Iterator[Prompt], drops: Counter[str]) -> Iterator[Prompt]:
    """Prompts with a user message to answer; one without has no turn in any mode, so it is
    counted (``no_user_message``) here instead of being asked or silently left out."""
    for p in prompts:
        if any(msg.role == "user" for msg in p.messages):
            yield p
        else:
            drops["no_user_message"] += 1


def first_turn_ids(
    tokens: TokensStage, d: DatasetCfg, prompts: Sequence[Prompt]
) -> list[list[int] | None]:
    """Each prompt's first turn rendered to ids, in one batched encode; None where it cannot be
    (its request renders it alone, and quarantines it with the reason). The prompts stage stores
    them with the prompts, so the request path does not encode them."""
    todo: dict[int, tuple[tuple[Message, ...], Prompt]] = {}
    for i, p in enumerate(prompts):
        try:
            todo[i] = (turn_messages(p, d.turns, 0, []), p)
        except (DraftdataError, TypeError, ValueError, AttributeError):
            continue
    got = dict(zip(todo, tokens.render_prompts(list(todo.values())), strict=True))
    return [got.get(i) for i in range(len(prompts))]


def no_prompts(
    m: Manifest, d: DatasetCfg, ledger: Ledger, dups: AbstractSet[str], drops: Counter[str]
) -> GenerateError:
    """Why dataset ``d`` holds no prompt: every prompt it read is already under a dataset the
    manifest no longer names (renamed, most likely; a dataset of the manifest that holds them
    is a plain duplicate), or its source gave none that could be kept."""
    named = {x.name for x in m.datasets}
    held = [
        n
        for n in sorted(status(ledger).datasets)
        if n not in named and dups & ledger.prompts.ids_of(n)
    ]
    if held:
        under = ", ".join(f'"{n}"' for n in held)
        one = len(held) == 1
        return GenerateError(
            f"dataset {d.name}: its prompts are already in this run under dataset"
            f"{'' if one else 's'} {under}, which {'is' if one else 'are'} not in the "
            f"manifest: was it renamed? Give it its old name again, or write to a new "
            f"[run] output folder (not {m.output_dir})"
        )
    return GenerateError(f"dataset {d.name}: {d.source} gave no prompts (skipped: {dict(drops)})")
