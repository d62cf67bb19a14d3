"""The count witness as a gate while a text-only dataset is generated (``tokens.counts``).

Each answer that came as text with the server's own counts is reconstructed as it arrives and
held against those counts (past the probe, one in ``STRIDE``). Once a dataset has ``[run]
count_probe`` such answers, a share of disagreements past ``[run] max_count_mismatch`` stops it
before more is paid: its ids are not what the model wrote, and more answers would be more of
the same. A rerun starts from what the dataset's stored samples already show, so it stops again
before its first request, until the threshold or the run's settings change."""

from __future__ import annotations

from collections import Counter

from ..config import DatasetCfg, Manifest
from ..errors import DraftdataError
from ..records import Completion, Counting
from ..store.ledger import Ledger
from ..store.stats import RunStatus, status
from ..tokens.counts import LABEL, checked_counting
from ..tokens.reconstruct import Item
from ..tokens.sample_maker import TokensStage
from .backends.base import GenRequest

#: past the probe, one answer in this many is checked as it arrives
STRIDE = 8


class CountWatch:
    """Per dataset: the answers with counts seen, and those whose ids disagree."""

    def __init__(self, m: Manifest, ledger: Ledger, stage: TokensStage) -> None:
        self.m = m
        self.max_share = m.run.max_count_mismatch
        self.probe = m.run.count_probe
        self.ledger = ledger
        #: the target the run reconstructs text with (``pipeline``: the learned one, after the
        #: gate)
        self.target = stage.target
        self.seen: Counter[str] = Counter()
        self.off: Counter[str] = Counter()
        #: answers with counts that arrived, each checked or not
        self.arrived: Counter[str] = Counter()
        #: each backend's counting convention as the run checked it (None: its profile's)
        self.counting: dict[str, Counting | None] = {}
        #: datasets stopped, with the one line that says why
        self.stopped: dict[str, str] = {}
        #: the ledger's status when the first dataset started (``start``)
        self.stored: RunStatus | None = None

    def start(self, d: DatasetCfg) -> None:
        """Count what the dataset's stored samples show (a rerun), and stop it at once where
        that is already past the threshold. The ledger's status is read once: a dataset's
        samples are made after its answers, never while the Runner asks them."""
        if d.name in self.seen:
            return
        if self.stored is None:
            self.stored = status(self.ledger)
        stored = self.stored.datasets.get(d.name)
        if stored is not None:
            dropped = stored.drops.get(f"quality:{LABEL}", 0)
            self.seen[d.name] = stored.samples + dropped
            self.off[d.name] = stored.warnings.get(LABEL, 0) + dropped
            self._judge(d.name)

    def see(self, d: DatasetCfg, req: GenRequest, c: Completion) -> None:
        """One answer as it arrives: counted where it came as text with the server's counts.
        Past the probe, one answer in ``STRIDE`` is (each is a reconstruction in the event
        loop; the tokens stage labels every sample all the same)."""
        if c.output_ids is not None or c.problem is not None or c.view.usage is None:
            return
        self.arrived[d.name] += 1
        if self.seen[d.name] >= self.probe and self.arrived[d.name] % STRIDE:
            return
        if d.backend not in self.counting:
            self.counting[d.backend] = checked_counting(self.ledger.meta, self.m, d.backend)
        counting = self.counting[d.backend]
        item = Item(req.messages, c.view, req.tools, prompt_ids=req.prompt_ids, counting=counting)
        (got,) = self.target.reconstruct_many([item])
        if isinstance(got, DraftdataError):
            return  # dropped by the tokens stage, with its reason
        self.seen[d.name] += 1
        self.off[d.name] += LABEL in got.warnings
        self._judge(d.name)

    def _judge(self, name: str) -> None:
        n, off = self.seen[name], self.off[name]
        if name in self.stopped or n < self.probe or off <= self.max_share * n:
            return
        self.stopped[name] = (
            f"{off} of {n} answers carry {LABEL}: the ids read from their text disagree with "
            f"the server's own token counts ({off / n:.0%} > [run] max_count_mismatch "
            f"{self.max_share:.0%}); nothing more is asked of it. See which counts differ with "
            "`draftdata status`; fix the format or the server profile, or raise the threshold "
            "and run again"
        )
