"""The gate: datasets whose backend returns text wait until reconstruction, measured on
ground truth generated with exact ids by the same target, reaches ``[run] min_exact``. A failed
gate stops the run before the first paid request; ``--force`` overrides it, and the override is
recorded in the export manifest."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import DraftdataError
from ..generate.backends import BACKENDS
from ..manifest import DatasetCfg, Manifest


class GateError(DraftdataError):
    """Reconstruction is not exact enough to spend money on text-only backends."""

    exit_code = 1


def is_ground_truth(m: Manifest, d: DatasetCfg) -> bool:
    """Generated with exact ids by the target itself (a local engine), unless the manifest says."""
    if d.ground_truth is not None:
        return d.ground_truth
    return BACKENDS[m.backends[d.backend].kind].exact_ids


@dataclass(frozen=True)
class Gate:
    min_exact: float
    exact_match_rate: float | None
    passed: bool
    forced: bool = False
    reason: str = ""
    #: some dataset waited on the gate (its backend returns text); False: nothing was gated
    gated: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def force(self) -> Gate:
        return replace(self, forced=True)

    def verdict(self) -> str:
        """One line that is true in every case: passed, failed, forced, or nothing to gate."""
        rate = self.exact_match_rate
        measured = (
            f"exact-match {rate:.1%} {'≥' if rate >= self.min_exact else '<'} min_exact "
            f"{self.min_exact:.1%}"
            if rate is not None
            else "nothing measured (no ground truth)"
        )
        if not self.gated:
            info = f"; {measured.split(' ≥')[0].split(' <')[0]} on ground truth, for information"
            return "gate: nothing to gate, every dataset returned exact ids" + (
                info if rate is not None else ""
            )
        if self.passed:
            return f"gate passed: {measured}"
        if self.forced:
            return f"gate FORCED past a failure (--force): {measured}"
        return f"gate FAILED: {measured}"


def decide(min_exact: float, rate: float | None, gated: bool, overall: str = "") -> Gate:
    """The verdict for a run: ``rate`` is the measured exact-match over the views that kept
    everything (None: nothing measured); ``gated`` says whether any dataset waits on it (one
    whose backend returns text); ``overall`` says the rate over every view, where some lost
    text at their server."""
    if not gated:
        return Gate(min_exact, rate, True, reason="no text-only datasets", gated=False)
    if rate is None:
        return Gate(
            min_exact,
            None,
            False,
            reason="no ground-truth dataset to measure reconstruction on; add one generated "
            'by the target with a local engine (kind = "hf")',
        )
    return Gate(
        min_exact,
        rate,
        rate >= min_exact,
        reason=f"exact-match {rate:.4f} vs min_exact {min_exact}" + overall,
    )
