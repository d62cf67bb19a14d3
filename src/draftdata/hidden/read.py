"""Reading hidden states back, every file checked against the sha256 its manifest recorded:
``read_stored`` (the samples of an output folder, in any layout and codec, fp8 dequantized) and
``verify`` (``draftdata hidden-states --verify OUT``: every file against its digest, and every
sample's stored ids against the ids of the export it was captured from)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..export.trainers.draft_vocab import is_vocab_file
from .codec import MANIFEST, CorruptFileError, load_tensors, read_checked
from .items import iter_items
from .nemo_cache import EMBEDDINGS, shard_samples

__all__ = ["Stored", "VerifyReport", "read_manifest", "read_stored", "verify"]

#: a per-sample file's index: speculators' hs_{i}, SpecForge's data_{i}, ModelOpt's {i:08d}
_INDEX = re.compile(r"(?:(?:hs|data)_(\d+)\.(?:safetensors|ckpt)|(?:^|/)(\d{8})\.pt)$")


@dataclass(frozen=True)
class Stored:
    """One sample as stored: its index in the export's order, its id where the layout keeps it
    (draftdata's shards, ModelOpt), its ids, and its tensors: ``hidden_states`` [S, k+1, H]
    (speculators and draftdata's shards), ``hidden_state`` [1, S, H] and ``aux_hidden_state``
    [1, S, k*H] (SpecForge), or ``hidden_states`` [S, H] and ``aux_hidden_states`` [S, k*H]
    (ModelOpt), with ``loss_mask`` where the file holds one; fp8 dequantized to float32 with its
    per-token scale. A NeMo Automodel cache sample holds its ``aux_hidden_states`` [S, 3H] and
    its shifted fields cut to its first S-1 slots (``nemo_cache.shard_samples``)."""

    index: int
    id: str
    token_ids: list[int]
    tensors: dict[str, Any]
    file: Path


def read_manifest(out: Path) -> dict[str, Any]:
    """``OUT/draftdata-hidden-states.json``, with the digests every read checks."""
    path = out / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(
            f"{path}: cannot read it ({e.strerror}); give the -o folder `draftdata hidden-states` "
            "wrote"
        ) from e
    except ValueError as e:
        raise CorruptFileError(f"{path}: not JSON ({e}); capture again into a new folder") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("sha256"), dict):
        raise InputError(
            f"{path} records no sha256 per file (written before draftdata checked its files); "
            "rerun `draftdata hidden-states` with the same -o to record them"
        )
    return doc


def _dequantized(t: dict[str, Any], key: str = "hidden_states") -> dict[str, Any]:
    scales = t.pop(f"{key}_scales", None)
    if scales is not None:
        t[key] = t[key].float() * scales.float()
    return t


def _samples(out: Path, rel: str, t: dict[str, Any], meta: dict[str, str]) -> Iterator[Stored]:
    path = out / rel
    if rel == EMBEDDINGS:  # NeMo Automodel's cache: the target's embeddings, no sample
        return
    if "position_mask" in t:  # NeMo Automodel's cache shard: samples stacked, padded, shifted
        for index, sid, ids, tensors in shard_samples(t, meta, path):
            yield Stored(index, sid, ids, tensors, path)
        return
    if "offsets" in t:  # draftdata's shard: many samples back to back
        m = json.loads(meta.get("draftdata", "{}"))
        offs = t["offsets"].tolist()
        hs = _dequantized({k: t[k] for k in t if k.startswith("hidden_states")})["hidden_states"]
        for n, index in enumerate(m.get("indices", [])):
            a, b = offs[n], offs[n + 1]
            ids = t["input_ids"][a:b].tolist()
            yield Stored(int(index), str(m["ids"][n]), ids, {"hidden_states": hs[a:b]}, path)
        return
    found = _INDEX.search(rel)
    if found is None:
        raise CorruptFileError(f"{path}: not a file name of a hidden-state layout")
    ids_key = "token_ids" if "token_ids" in t else "input_ids"
    ids = t.pop(ids_key).tolist()
    sid = t.pop("id", "")  # ModelOpt's files keep the sample's id
    index = int(found.group(1) or found.group(2))
    yield Stored(index, str(sid), ids, _dequantized(t), path)


def read_stored(out: Path, torch: Any | None = None) -> Iterator[Stored]:
    """Every sample of the capture in ``out``, file by file in name order; a file whose bytes
    are not those its manifest recorded stops the read with a ``CorruptFileError`` naming it."""
    if torch is None:
        import torch
    doc = read_manifest(out)
    for rel, sha in sorted(doc["sha256"].items()):
        if is_vocab_file(rel):  # the draft vocabulary beside the states: no sample in it
            read_checked(out / rel, str(sha))
            continue
        t, meta = load_tensors(out / rel, str(sha), torch)
        yield from _samples(out, rel, t, meta)


@dataclass
class VerifyReport:
    """What ``verify`` read, and every problem it found (one line each, naming the file)."""

    files: int = 0
    samples: int = 0
    tokens: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _export_ids(doc: dict[str, Any], out: Path) -> tuple[dict[int, list[int]] | None, str]:
    """The ids of the samples of the export the capture read (by index); None and why where it
    is gone."""
    inputs = [Path(p) for p in doc.get("inputs", [])]
    gone = [str(p) for p in inputs if not p.exists()]
    if not inputs or gone:
        return None, (
            f"{out / MANIFEST}: the export it was captured from ({', '.join(gone) or 'none named'}) "
            "is not there, so the stored ids are not checked against it; verify where it is"
        )
    try:
        return {it.index: it.input_ids for it in iter_items(inputs)}, ""
    except InputError as e:
        return None, f"{out / MANIFEST}: its export cannot be read ({e})"


#: the stored dtype each manifest dtype means
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp8": "float8_e4m3fn"}


@dataclass
class _Shape:
    """What every file of a capture must hold, from its manifest: the stored dtype, the number
    of aux layers, and the hidden size (from the first file: one model, one size)."""

    dtype: str | None
    aux: int | None
    hidden: int | None = None

    @classmethod
    def of(cls, doc: dict[str, Any]) -> _Shape:
        layers = doc.get("layers")
        aux = layers.get("aux") if isinstance(layers, dict) else None
        return cls(_DTYPES.get(str(doc.get("dtype"))), len(aux) if isinstance(aux, list) else None)

    def problems(self, path: Path, t: dict[str, Any]) -> list[str]:
        """Where the states of one file are not what the manifest says (dtype, layers, size)."""
        # (tensor, what its last two dims hold in layers: k+1 stacked, k side by side, 1)
        k = self.aux
        want: list[tuple[str, str, int | None]]
        if "position_mask" in t:  # NeMo's cache shard: the aux layers side by side
            want = [("aux_hidden_states", "cat", 3 if k is None else k)]
        elif "aux_hidden_state" in t:  # SpecForge
            want = [("hidden_state", "one", 1), ("aux_hidden_state", "cat", k)]
        elif "aux_hidden_states" in t:  # ModelOpt
            want = [("hidden_states", "one", 1), ("aux_hidden_states", "cat", k)]
        elif "hidden_states" in t:  # speculators' files and draftdata's shards: [S, k+1, H]
            want = [("hidden_states", "stack", None if k is None else k + 1)]
        else:
            return [f"{path}: holds no hidden states"]
        out = []
        for key, how, n in want:
            x = t.get(key)
            if x is None:
                out.append(f"{path}: no {key}")
                continue
            dt = str(x.dtype).removeprefix("torch.")
            if self.dtype is not None and dt != self.dtype:
                out.append(f"{path}: {key} is {dt}, the manifest says {self.dtype}")
            if how == "stack":
                if x.dim() != 3 or (n is not None and x.shape[1] != n):
                    out.append(f"{path}: {key} holds {tuple(x.shape)}, not [S, {n}, H]")
                    continue
                h = int(x.shape[2])
            elif how == "cat":
                if n is None:
                    continue
                if x.shape[-1] % n:
                    out.append(f"{path}: {key} is {x.shape[-1]} wide, not {n} layers of one size")
                    continue
                h = int(x.shape[-1]) // n
            else:
                h = int(x.shape[-1])
            if self.hidden is None:
                self.hidden = h
            elif h != self.hidden:
                out.append(f"{path}: {key} holds layers of {h}, the other files {self.hidden}")
        if (
            self.dtype == "float8_e4m3fn"
            and "hidden_states" in t
            and "hidden_states_scales" not in t
        ):
            out.append(f"{path}: fp8 states without hidden_states_scales")
        return out


def _verify_file(
    rep: VerifyReport,
    out: Path,
    rel: str,
    loaded: tuple[dict[str, Any], dict[str, str]],
    want: dict[int, list[int]] | None,
    seen: set[int],
) -> None:
    """The samples of one file against the export's ids (each index once)."""
    path = out / rel
    for s in _samples(out, rel, *loaded):
        rep.samples += 1
        rep.tokens += len(s.token_ids)
        if s.index in seen:
            rep.problems.append(f"{path}: sample {s.index} is stored twice")
        seen.add(s.index)
        if want is not None and want.get(s.index) != s.token_ids:
            rep.problems.append(
                f"{path}: sample {s.index}'s token_ids are not the export's ids for "
                "that sample; capture it again (rerun with the same -o)"
            )


def verify(
    out: Path, progress: Callable[[VerifyReport, int], None] | None = None, torch: Any = None
) -> VerifyReport:
    """Re-read every file of ``out`` against its recorded sha256, and every sample's stored ids
    against the export's ids for that sample; every sample of the export must be stored once.
    ``progress(report, total_files)`` is called after each file."""
    if torch is None:
        import torch
    doc = read_manifest(out)
    rep = VerifyReport()
    want, why = _export_ids(doc, out)
    if why:
        rep.problems.append(why)
    seen: set[int] = set()
    shape = _Shape.of(doc)
    files = sorted(doc["sha256"].items())
    for rel, sha in files:
        path = out / rel
        rep.files += 1
        try:
            rep.bytes += path.stat().st_size
            if is_vocab_file(rel):  # checked by its digest; it holds no sample
                read_checked(path, str(sha))
            else:
                loaded = load_tensors(path, str(sha), torch)
                if rel != EMBEDDINGS:
                    rep.problems += shape.problems(path, loaded[0])
                _verify_file(rep, out, rel, loaded, want, seen)
        except (CorruptFileError, OSError) as e:
            rep.problems.append(str(e) if isinstance(e, CorruptFileError) else f"{path}: {e}")
        if progress is not None:
            progress(rep, len(files))
    if want is not None:
        missing = sorted(set(want) - seen)
        if missing:
            rep.problems.append(
                f"{out}: {len(missing)} of the export's {len(want)} samples have no readable file "
                f"(first: sample {missing[0]}); rerun `draftdata hidden-states` with the same -o"
            )
    return rep
