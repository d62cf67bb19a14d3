"""A run folder belongs to one configuration. What would change the meaning of a dataset's
samples (the target's tokenizer and format, the backend's model, sampling, turns, the reader, and
the backend options that reach the request or read the answer: ``extra_body``, which may hold
sampling of its own, the server profile and ``token_ids``) is stored per dataset; a rerun that
changes any of it is refused with a one-line diff. A setting the stored ones lack was not
recorded then (a ledger from an older draftdata): the current value is taken. ``limit``
may grow with ``--extend`` (only the new prompts are asked for). A changed source file is read
again: prompts that already have answers keep them, unanswered ones follow the file (so fixing a
bad record in the input helps). Concurrency, timeouts, prices and the budget may change freely."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import DatasetCfg, Manifest, redact_url
from ..errors import DraftdataError
from ..formats import BoundFormat
from ..records.meta import DatasetSettings


class SettingsChangedError(DraftdataError):
    """The manifest asks for something other than what the run folder holds."""


def source_sha256(path: Path) -> str:
    """The source's content: a file's bytes, or a folder's file names, sizes and bytes."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def settings_of(m: Manifest, d: DatasetCfg, bound: BoundFormat) -> DatasetSettings:
    cfg = m.backends[d.backend]
    src = m.resolve(d.source)
    return {
        "tokenizer_sha256": bound.tokenizer.sha256,
        "format": f"{bound.format.name} v{bound.format.version}",
        "thinking": m.target.thinking,
        "backend_kind": cfg.kind,
        "backend_model": getattr(cfg, "model", None)
        or getattr(cfg, "model_path", None)
        or m.target.model,
        "sampling": d.sampling.model_dump(),
        # an OpenAI-compatible backend's options: extra_body is merged into every request body
        # (it may override the sampling above); the server profile adds request options and
        # says how the answers are read; token_ids says whether exact ids are asked for
        "extra_body": getattr(cfg, "extra_body", None),
        "server": getattr(cfg, "server", None),
        "token_ids": getattr(cfg, "token_ids", None),
        "samples_per_prompt": d.samples_per_prompt,
        "turns": d.turns,
        "reader": d.reader,
        "columns": dict(d.columns),
        "tools_prompt": d.tools_prompt,
        "system": d.system,
        "source_sha256": source_sha256(src) if src.exists() else None,
    }


#: compared whole, not key by key: a table of free-form keys, where a key set to null and a key
#: left out are different requests
_WHOLE = frozenset({"columns", "extra_body"})


def _flat(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict) and k not in _WHOLE:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check(
    m: Manifest,
    d: DatasetCfg,
    now: DatasetSettings,
    stored: DatasetSettings | None,
    stored_limit: int | None,
    extend: bool,
) -> bool:
    """Raise SettingsChangedError naming what changed and the two ways forward; True when only
    the source's content changed (its prompts are to be read again)."""
    if stored is None:
        return False
    # a setting the stored ones lack was not recorded then (written by an older draftdata):
    # the current value is taken, and stored from this run on by the caller
    a, b = _flat(stored), _flat({k: v for k, v in now.items() if k in stored})
    changed = [
        f"{k} {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and k != "source_sha256"
    ]
    source_changed = a.get("source_sha256") != b.get("source_sha256")
    if stored_limit != d.limit:
        grew = d.limit is None or (stored_limit is not None and d.limit > stored_limit)
        if not (grew and extend):
            changed.append(f"limit {json.dumps(stored_limit)} -> {json.dumps(d.limit)}")
    if not changed:
        return source_changed
    only_limit = all(c.startswith("limit ") for c in changed)
    way = (
        "pass --extend to ask only for the new prompts"
        if only_limit and (d.limit is None or (stored_limit or 0) < d.limit)
        else f"write to a new [run] output folder (not {m.output_dir}), or put the settings back"
    )
    raise SettingsChangedError(
        f"dataset {d.name}: the run folder was made with other settings ({'; '.join(changed)}); "
        f"its answers would be stamped with settings that did not make them: {way}"
    )


def stored_manifest(m: Manifest) -> dict[str, Any]:
    """The manifest as the ledger keeps it: credentials in a base_url are redacted."""
    doc = m.model_dump(mode="json", exclude={"base_dir", "path"})
    for b in doc.get("backends", {}).values():
        if isinstance(b.get("base_url"), str):
            b["base_url"] = redact_url(b["base_url"])
    return doc
