"""The quality checks across a run's answers, and the decision to keep or drop a sample.

``tokens.quality`` holds the checks as pure functions; the tokens stage adds the per-answer ones
to each sample (``TokensStage.with_quality``). What needs the run's state lives here, one
``RunChecks`` per run: the ``AnswerIndex`` of ``near_duplicate_answer`` (answers keyed by
dataset, prompt id and turn, so the samples of one prompt never flag each other but a second
turn that repeats the first does) and the language detector of ``language_mismatch``
(py3langid, loaded once, and only when an answer and its prompt are both long enough to judge).
``[run] drop`` names the checks whose samples are dropped, as ``quality:<check>``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from ..records import Answered, ApiView
from .quality import LANGUAGE_MIN_CHARS, QUALITY_CHECKS, AnswerIndex, language_mismatch

#: the share of a text py3langid must give its language for the language to count
LANGUAGE_MIN_PROB = 0.9
#: the drop reason of a sample a quality check removed: ``quality:<check>``
DROP_PREFIX = "quality:"

_ORDER = {name: i for i, (name, _) in enumerate(QUALITY_CHECKS)}


def load_language_detector() -> Callable[[str], str | None]:
    """py3langid's model as ``text -> language code`` (None below ``LANGUAGE_MIN_PROB``).
    Measured on 2 cores: 0.17 s to import, 0.66 s to load the model, about 100 MB of memory;
    then about 0.2 ms a 600-character text."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier  # type: ignore[import-untyped]

    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)

    def detect(text: str) -> str | None:
        lang, p = ident.classify(text)
        return str(lang) if p >= LANGUAGE_MIN_PROB else None

    return detect


def prompt_text(a: Answered) -> str:
    """The text an answer's language is compared with: its last user message."""
    for m in reversed(a.messages):
        if m.role == "user" and m.content:
            return m.content
    return ""


def for_checks(a: Answered) -> Answered:
    """``a`` with only what ``RunChecks.across`` reads of it (its key, its answer's content and
    its last user message): the tokens stage holds every answer out to its workers this way,
    not with its parsed body."""
    last = next((m for m in reversed(a.messages) if m.role == "user" and m.content), None)
    stored = replace(
        a.stored, response={}, output_ids=None, server_prompt_ids=None, our_prompt_ids=None
    )
    view = ApiView(a.view.content, a.view.finish_reason)
    return Answered(a.key, a.prompt, (last,) if last is not None else (), stored, view)


class RunChecks:
    """The cross-answer checks of one run and its ``[run] drop`` list. ``loader`` makes the
    language detector (called at most once, and only when an answer needs it); ``load_s`` is
    how long that took (None: not loaded)."""

    def __init__(
        self,
        drop: Iterable[str] = (),
        *,
        index: AnswerIndex | None = None,
        loader: Callable[[], Callable[[str], str | None]] = load_language_detector,
    ) -> None:
        self.drop = frozenset(drop)
        self.index = index if index is not None else AnswerIndex()
        self._loader = loader
        self._detect: Callable[[str], str | None] | None = None
        self.load_s: float | None = None

    def detect(self, text: str) -> str | None:
        if self._detect is None:
            t0 = time.perf_counter()
            self._detect = self._loader()
            self.load_s = time.perf_counter() - t0
        return self._detect(text)

    def across(self, a: Answered) -> list[str]:
        """The names of the cross-answer checks that fire on answer ``a``."""
        out: list[str] = []
        text = a.view.content or ""
        k = a.key
        if self.index.seen(f"{k.dataset}/{k.prompt_id}/{k.turn}", text) is not None:
            out.append("near_duplicate_answer")
        prompt = prompt_text(a)
        long_enough = min(len(prompt.strip()), len(text.strip())) >= LANGUAGE_MIN_CHARS
        if long_enough and language_mismatch(prompt, text, self.detect):
            out.append("language_mismatch")
        return out

    def dropped(self, warnings: Sequence[str]) -> str | None:
        """The drop reason (``quality:<check>``, the first check in report order) when one of
        ``warnings`` is a check ``[run] drop`` names; None: the sample is kept."""
        hit = sorted((w for w in warnings if w in self.drop), key=lambda w: _ORDER.get(w, 99))
        return DROP_PREFIX + hit[0] if hit else None


__all__ = ["DROP_PREFIX", "RunChecks", "for_checks", "load_language_detector", "prompt_text"]
