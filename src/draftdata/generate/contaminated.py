"""``[run] decontaminate``: prompts that hold an evaluation prompt are dropped when a dataset is
read, before any is asked, and counted as ``contaminated:<set>`` among the dataset's read drops;
the tally (prompts checked, flagged by set, the first matches) goes into the ledger as
``contamination:<dataset>`` for the report. A mixin of
:class:`~draftdata.generate.runner.Runner`."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from ..config import DatasetCfg, Manifest
from ..measure.contamination import Detector, Tally, detector_for
from ..store.ledger import Ledger
from ..store.meta import CONTAMINATION


class DecontaminateMixin:
    m: Manifest
    ledger: Ledger
    console: Console
    quiet: bool
    _decontaminator: Detector | None = None

    def decontaminator(self) -> Detector | None:
        """The detector of ``[run] decontaminate`` (built once per run), or None."""
        specs = self.m.run.decontaminate
        if not specs:
            return None
        if self._decontaminator is None:
            self._decontaminator = detector_for(specs, self.m.base_dir)
        return self._decontaminator

    def record_contamination(self, d: DatasetCfg, tally: Tally, checked: bool) -> None:
        """A dataset's contamination tally into the ledger (``contamination:<dataset>``), for
        the report, with a line saying what was dropped."""
        if not checked:
            return
        self.ledger.meta.put(CONTAMINATION.of(d.name), tally.record())
        if tally.total and not self.quiet:
            by = ", ".join(f"{k}: {v}" for k, v in sorted(tally.flagged.items()))
            self.console.print(
                Text(
                    f"{d.name}: {tally.total} of {tally.checked} prompts dropped as contaminated "
                    f"({by}) before generation"
                )
            )
