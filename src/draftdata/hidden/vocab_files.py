"""The draft vocabulary written beside a capture (speculators' ``token_freq.pt`` and ``d2t`` /
``t2d``, SpecForge's ``vocab_mapping.pt``), counted over the trained ids of the samples
captured, by each trainer's own rule (``export.trainers.draft_vocab``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..export.trainers.draft_vocab import (
    SPECFORGE_MAPPING,
    TOKEN_FREQ,
    TrainedCounts,
    check_size,
    write_specforge,
    write_speculators,
)
from .codec import sha256_file

if TYPE_CHECKING:
    from ..model.load import LoadedModel
    from .layers import Layers


class DraftVocabFiles:
    """A layout mixin: ``draft_vocab`` (None: the trainer's default), the model and inputs kept
    at ``bind``, and ``write_vocab`` at ``close``."""

    out: Path
    torch: Any
    sums: dict[str, str]
    draft_vocab: int | None = None
    model: str | None = None
    files: list[Path]

    def bind(
        self, model: str, layers: Layers, files: list[Path], lm: LoadedModel | None = None
    ) -> None:
        from .layers import vocab_size_in

        self.model, self.files = model, files
        check_size(self.draft_vocab, vocab_size_in(Path(model)))  # before the capture, not after

    def write_vocab(self, doc: dict[str, Any], trainer: str) -> None:
        """The trainer's vocabulary files (each digest in ``sums``), described in ``doc``;
        nothing where no model was bound (a Ray actor's part) or SpecForge has no size."""
        from .items import iter_items
        from .layers import vocab_size_in

        if self.model is None or (trainer == "specforge" and self.draft_vocab is None):
            return
        vocab = vocab_size_in(Path(self.model))
        counts = TrainedCounts.of((it.input_ids, it.loss_mask) for it in iter_items(self.files))
        if trainer == "speculators":
            paths = write_speculators(self.out, counts, vocab, self.draft_vocab, self.torch)
            doc["draft_vocab"] = {"token_freq": TOKEN_FREQ, "size": self.draft_vocab}
        else:
            assert self.draft_vocab is not None
            paths = [write_specforge(self.out, counts, vocab, self.draft_vocab, self.torch)]
            doc["draft_vocab"] = {"mapping": SPECFORGE_MAPPING, "size": self.draft_vocab}
        doc["draft_vocab"]["trained_ids"] = len(counts.counts)
        for path in paths:
            self.sums[path.relative_to(self.out).as_posix()] = sha256_file(path)
