"""A run read back from its ledger: the manifest it was made with. Here, not in ``config``, because
it reads the ledger; ``config`` imports no stage."""

from __future__ import annotations

from pathlib import Path

from ..config import BACKENDS, Manifest, ManifestError
from ..config.backends import load_plugins
from .ledger import Ledger
from .meta import MANIFEST, MANIFEST_BASE_DIR


def manifest_of_run(run_dir: Path) -> Manifest:
    """The manifest a run was made with, as stored in its ledger (paths resolved as then)."""
    led = Ledger.read(run_dir / "ledger.sqlite")
    try:
        raw, base = led.meta.get(MANIFEST), led.meta.get(MANIFEST_BASE_DIR, ".")
    finally:
        led.close()
    if raw is None:
        raise ManifestError(f"{led.path}: holds no manifest; it was not made by `draftdata run`")
    load_plugins()  # a kind a plugin registers, as `load_manifest` finds it
    backends = raw.get("backends")
    kinds = {b.get("kind") for b in (backends or {}).values() if isinstance(b, dict)}
    unknown = sorted(str(k) for k in kinds - set(BACKENDS))
    if unknown:
        raise ManifestError(
            f"{run_dir}: the run was made with backend kind {', '.join(unknown)}, which no "
            "installed package registers now; install the plugin that provides it"
        )
    m = Manifest.model_validate(raw)
    m.base_dir = Path(base)
    m.path = run_dir / "manifest.toml"
    return m
