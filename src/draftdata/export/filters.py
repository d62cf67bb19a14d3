"""``draftdata export --drop``: which samples an export leaves out, and how many each filter took.

A filter is a quality check's name (a sample carrying that warning is left out: the tokens stage
adds them, ``tokens.quality``) or ``contaminated`` (a sample whose prompt holds an evaluation
prompt: ``measure.contamination``, against the manifest's ``[run] decontaminate`` sets, or every
built-in set where it names none). The ledger keeps every sample; only the export is filtered,
so a different ``--drop`` is one more ``draftdata export``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from ..config import QUALITY_CHECK_NAMES
from ..errors import InputError
from ..records import Sample

#: the filter of samples whose prompt is contaminated
CONTAMINATED = "contaminated"
#: every name ``--drop`` takes
EXPORT_FILTERS: tuple[str, ...] = (*QUALITY_CHECK_NAMES, CONTAMINATED)


def parse_drop(specs: Iterable[str]) -> tuple[str, ...]:
    """``--drop a,b --drop c`` as ``(a, b, c)`` (first mention kept); an InputError naming the
    choices for a name that is not one."""
    out: list[str] = []
    for spec in specs:
        for name in (x.strip() for x in spec.split(",")):
            if not name:
                continue
            if name not in EXPORT_FILTERS:
                raise InputError(
                    f"--drop {name!r}: not a filter; choose from {', '.join(EXPORT_FILTERS)} "
                    "(comma-separated)"
                )
            if name not in out:
                out.append(name)
    return tuple(out)


class SampleFilter:
    """Passes the samples no filter fits; ``filtered`` counts the others by dataset and filter
    (each under the first filter of ``names`` that fits it). ``contaminated``: the
    (dataset, prompt id) pairs flagged, where ``names`` holds ``contaminated``."""

    def __init__(
        self,
        names: Sequence[str],
        contaminated: frozenset[tuple[str, str]] = frozenset(),
        filtered: dict[str, dict[str, int]] | None = None,
    ) -> None:
        self.names = tuple(names)
        self.contaminated = contaminated
        self.filtered: dict[str, dict[str, int]] = filtered if filtered is not None else {}

    def why(self, s: Sample) -> str | None:
        """The first filter that fits ``s``, or None."""
        for name in self.names:
            if name == CONTAMINATED:
                if s.key is not None and (s.dataset, s.key.prompt_id) in self.contaminated:
                    return name
            elif name in s.warnings:
                return name
        return None

    def __call__(self, samples: Iterable[Sample]) -> Iterator[Sample]:
        for s in samples:
            why = self.why(s)
            if why is None:
                yield s
                continue
            per = self.filtered.setdefault(s.dataset, {})
            per[why] = per.get(why, 0) + 1

    def total(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for per in self.filtered.values():
            out.update(per)
        return out


__all__ = ["CONTAMINATED", "EXPORT_FILTERS", "SampleFilter", "parse_drop"]
