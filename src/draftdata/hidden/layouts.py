"""The files each trainer reads offline, one writer per layout (the trainer registry,
``export.trainers.TRAINERS``, names them and holds each layout's rules).

- ``speculators``: ``OUT/`` is a ``save_to_disk`` dataset (``input_ids``, ``loss_mask`` int64,
  ``seq_len``) and ``OUT/hidden_states/hs_{i}.safetensors`` holds row ``i``'s ``token_ids`` int64
  [S] and ``hidden_states`` [S, k+1, H]: the aux layers, then the last layer before the final
  norm. With fp8, ``hidden_states`` is float8 e4m3 and ``hidden_states_scales`` [S, 1, 1] float32
  the per-token scale (what speculators' FP8 file transfer reads back).
- ``specforge``: ``OUT/rows_{a}-{b}/data_{i}.ckpt``, one ``torch.save`` dict per sample:
  ``input_ids`` and ``loss_mask`` int64 [S], ``hidden_state`` [1, S, H] (the last layer after the
  final norm) and ``aux_hidden_state`` [1, S, k*H], lowest layer first.
- ``modelopt``: ``OUT/{i:08d}.pt``, one ``torch.save`` dict per sample, the record
  ``export.trainers.modelopt.offline_record`` builds for ModelOpt's ``OfflineSupervisedDataset``:
  ``id``, ``input_ids`` and ``loss_mask`` int64 [S], ``hidden_states`` [S, H] (the last layer
  after the final norm: ModelOpt's offline forward takes ``lm_head(hidden_states)`` as the
  target's logits) and ``aux_hidden_states`` [S, k*H], lowest layer first. Flat, so both of
  ModelOpt's globs (``rglob("*.pt")`` in its trainer, ``glob("*.pt")`` in its calibration) see
  every file.
- ``safetensors``: draftdata's own shards, ``OUT/hs-{first}-{last}.safetensors``, each holding
  many samples back to back (``input_ids`` int64 [T], ``loss_mask`` uint8 [T], ``offsets`` int64
  [n+1], ``hidden_states`` [T, k+1, H] as in speculators, fp8 with ``hidden_states_scales``), the
  samples' ids in the file's metadata, and ``OUT/index.json``. With ``--codec zstd`` each shard
  is one zstd frame over that whole file, ``hs-{first}-{last}.safetensors.zst`` (fp8 + zstd: 0.41x
  the bytes of bf16 on SmolLM2, relative error 0.011, BENCHMARKS.md).

Every file's sha256 goes into ``draftdata-hidden-states.json`` (``sha256``: path relative to
``OUT`` -> digest); ``hidden.read`` checks it on every read.

The hidden states are encoded on the device they were computed on and copied to the host; the
file writes run on writer threads while the next batch computes. Every file is written through
``draftdata.files`` (a temporary name, then a rename), so a file that exists is whole; a
rerun skips every sample whose file exists with the same ids and the digest the last manifest
recorded (resumable per sample; per shard for ``safetensors``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..export.trainers import DTYPES, layout_trainer
from ..export.trainers.modelopt import file_name as modelopt_file
from ..export.trainers.modelopt import offline_record
from ..export.trainers.settings import write_modelopt_recipe
from ..files import atomic_path, write_bytes, write_json
from .codec import (
    MANIFEST,
    SUFFIX,
    CorruptFileError,
    check_codec,
    compress,
    decode_tensors,
    sha256_bytes,
    sha256_file,
)
from .identity import CAPTURE_FILE
from .items import Item
from .vocab_files import DraftVocabFiles

if TYPE_CHECKING:
    from ..model.load import LoadedModel
    from .capture import Captured
    from .layers import Layers

__all__ = ["DTYPES", "Encoder", "Item", "make_layout"]

#: samples per SpecForge rows_* folder
ROWS_PER_FOLDER = 1000
#: about this many bytes of hidden states per draftdata safetensors shard
SHARD_BYTES = 1 << 30


class Encoder:
    """Stored dtype of the hidden states; fp8 (e4m3, one scale per token over all its layers)
    keeps the squared error against bf16 so the report can give its relative error. ``codec``
    is the byte codec over the files (draftdata's own shards only)."""

    def __init__(self, torch: Any, dtype: str, codec: str = "none") -> None:
        if dtype not in DTYPES:
            raise InputError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        if dtype == "fp8" and not hasattr(torch, "float8_e4m3fn"):
            raise InputError(f"--dtype fp8: torch {torch.__version__} has no float8_e4m3fn")
        self.torch = torch
        self.dtype = dtype
        self.codec = check_codec(codec)
        self.err_sq = 0.0
        self.ref_sq = 0.0

    @property
    def stored(self) -> Any:
        """The torch dtype the states are stored in."""
        t = self.torch
        return {"fp32": t.float32, "bf16": t.bfloat16, "fp8": getattr(t, "float8_e4m3fn", None)}[
            self.dtype
        ]

    def encode(self, x: Any) -> dict[str, Any]:
        """``hidden_states`` (and ``hidden_states_scales`` for fp8) for a [S, ...] tensor."""
        torch = self.torch
        if self.dtype == "fp32":
            return {"hidden_states": x.float().contiguous()}
        ref = x.to(torch.bfloat16)
        if self.dtype == "bf16":
            return {"hidden_states": ref.contiguous()}
        f8 = torch.float8_e4m3fn
        x32 = x.float()
        dims = tuple(range(1, x32.dim()))
        scale = (x32.abs().amax(dim=dims, keepdim=True) / torch.finfo(f8).max).clamp(min=1e-12)
        q = (x32 / scale).to(f8)
        back = q.float() * scale
        r = ref.float()
        self.err_sq += float(((back - r) ** 2).sum())
        self.ref_sq += float((r**2).sum())
        return {"hidden_states": q.contiguous(), "hidden_states_scales": scale.contiguous()}

    def report(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"dtype": self.dtype, "codec": self.codec}
        if self.dtype == "fp8":
            doc["fp8_relative_error_vs_bf16"] = (
                (self.err_sq / self.ref_sq) ** 0.5 if self.ref_sq else 0.0
            )
        return doc


#: a file write prepared on the calling thread (the tensors already on the host), run later on a
#: writer thread; returns the bytes written
Job = Callable[[], int]


def _host(tensors: dict[str, Any]) -> dict[str, Any]:
    return {k: v.cpu() for k, v in tensors.items()}


def _stack(cap: Captured, torch: Any) -> Any:
    """[S, k+1, H]: the aux layers, then the last one before the final norm."""
    return torch.cat([cap.aux, cap.last[:, None, :]], dim=1)


def _normed_and_aux(cap: Captured, enc: Encoder) -> tuple[Any, Any]:
    """On the host: the last layer after the final norm [S, H] and the aux layers side by side
    [S, k*H], lowest layer first (SpecForge's and ModelOpt's files)."""
    aux = cap.aux.reshape(cap.aux.shape[0], -1)
    return (
        _host(enc.encode(cap.last_normed))["hidden_states"],
        _host(enc.encode(aux))["hidden_states"],
    )


def _torch_save(torch: Any, d: dict[str, Any], path: Path) -> None:
    """``torch.save`` through a file object: the archive inside is named ``archive`` (a path
    would name it after the temporary file), so the same states make the same bytes."""
    with path.open("wb") as f:
        torch.save(d, f)


def _atomic(path: Path, write: Callable[[Path], Any]) -> int:
    """``write`` the file ``path`` through its temporary path; the bytes written."""
    with atomic_path(path) as tmp:
        write(tmp)
    return path.stat().st_size


class _Files:
    """The sha256 of every hidden-state file of this run (``sums``: path relative to ``out`` ->
    hex digest): each file written now, and each earlier run's file kept. An earlier run's file
    is kept only where it is the file its manifest recorded (``recorded``); one that is not (a
    flipped bit, a copy cut short) is captured again."""

    out: Path
    torch: Any
    #: whether ``write`` needs the model's logits (``Captured.logits``)
    keep_logits = False

    def bind(
        self, model: str, layers: Layers, files: list[Path], lm: LoadedModel | None = None
    ) -> None:
        """The model (its folder), layers and input files of the capture, and the loaded model
        where this process runs it, before ``prepare`` (a layout that writes what depends on
        them keeps them)."""

    def _start_sums(self) -> None:
        self.sums: dict[str, str] = {}
        self.recorded: dict[str, str] = {}
        try:
            doc = json.loads((self.out / MANIFEST).read_text(encoding="utf-8"))
            self.recorded = {str(k): str(v) for k, v in dict(doc.get("sha256") or {}).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            pass  # no earlier manifest (or an unreadable one): files are kept by their ids

    def rel(self, path: Path) -> str:
        return path.relative_to(self.out).as_posix()

    def _earlier(self, path: Path) -> tuple[dict[str, Any], dict[str, str]] | None:
        """An earlier run's file (its tensors and metadata), its digest put in ``sums``; None
        where it is missing, is not the file recorded, or does not decode."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        sha = sha256_bytes(data)
        want = self.recorded.get(self.rel(path))
        if want is not None and sha != want:
            return None
        try:
            got = decode_tensors(path, data, self.torch)
        except CorruptFileError:
            return None
        self.sums[self.rel(path)] = sha
        return got

    def _holds(self, path: Path, key: str, ids: list[int], states: str) -> bool:
        """Whether an earlier run's ``path`` is the recorded file and holds ``ids`` under
        ``key``, and its ``states`` in the dtype this capture stores (unreadable, changed or of
        another dtype: captured again)."""
        got = self._earlier(path)
        if got is None or key not in got[0] or got[0][key].tolist() != ids:
            return False
        enc: Encoder = getattr(self, "enc")  # noqa: B009 (every layout with files has one)
        return states in got[0] and got[0][states].dtype == enc.stored

    def _write(self, path: Path, write: Callable[[Path], Any]) -> int:
        """``_atomic``, the file's digest put in ``sums`` (on the writer thread)."""
        n = _atomic(path, write)
        self.sums[self.rel(path)] = sha256_file(path)
        return n


class Speculators(DraftVocabFiles, _Files):
    name = "speculators"

    def __init__(self, out: Path, torch: Any, enc: Encoder, draft_vocab: int | None = None) -> None:
        self.out, self.torch, self.enc, self.draft_vocab = out, torch, enc, draft_vocab
        self._start_sums()
        self.folder = out / "hidden_states"

    def path(self, index: int) -> Path:
        return self.folder / f"hs_{index}.safetensors"

    def prepare(self, items: Iterator[Item]) -> None:
        from ..export.trainers.speculators import write_dataset

        # the rows are written again on every run (ids only: cheap beside the capture); the
        # hidden-state files beside them are kept and checked one by one against the rows
        write_dataset(
            (it.sample() for it in items), self.out, keep=("hidden_states", CAPTURE_FILE, MANIFEST)
        )

    def done(self, it: Item) -> bool:
        return self._holds(self.path(it.index), "token_ids", it.input_ids, "hidden_states")

    def write(self, it: Item, cap: Captured) -> Job:
        from safetensors.torch import save_file

        torch = self.torch
        tensors = {"token_ids": torch.tensor(it.input_ids, dtype=torch.long)}
        tensors.update(_host(self.enc.encode(_stack(cap, torch))))
        path = self.path(it.index)
        return lambda: self._write(path, lambda t: save_file(tensors, str(t)))

    def close(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"files": "hidden_states/hs_{i}.safetensors", "dataset": "."}
        self.write_vocab(doc, "speculators")
        doc["sha256"] = dict(sorted(self.sums.items()))
        return doc


class _TorchFiles(_Files):
    """A layout of one ``torch.save`` dict per sample (SpecForge, ModelOpt): nothing to prepare,
    a sample is done when its file holds its ids, and the same states make the same bytes."""

    #: the tensor whose dtype says how a file's states are stored
    states_key = "hidden_states"

    def __init__(self, out: Path, torch: Any, enc: Encoder) -> None:
        self.out, self.torch, self.enc = out, torch, enc
        self._start_sums()

    def path(self, index: int) -> Path:
        raise NotImplementedError

    def prepare(self, items: Iterator[Item]) -> None:
        for _ in items:
            pass

    def done(self, it: Item) -> bool:
        return self._holds(self.path(it.index), "input_ids", it.input_ids, self.states_key)

    def _save(self, it: Item, d: dict[str, Any]) -> Job:
        """The job that writes ``d`` as ``it``'s file (on a writer thread)."""
        path, torch = self.path(it.index), self.torch
        return lambda: self._write(path, lambda t: _torch_save(torch, d, t))


class SpecForge(DraftVocabFiles, _TorchFiles):
    name = "specforge"
    states_key = "hidden_state"

    def __init__(self, out: Path, torch: Any, enc: Encoder, draft_vocab: int | None = None) -> None:
        super().__init__(out, torch, enc)
        self.draft_vocab = draft_vocab

    def path(self, index: int) -> Path:
        a = index // ROWS_PER_FOLDER * ROWS_PER_FOLDER
        return self.out / f"rows_{a}-{a + ROWS_PER_FOLDER}" / f"data_{index}.ckpt"

    def write(self, it: Item, cap: Captured) -> Job:
        torch = self.torch
        last, aux = _normed_and_aux(cap, self.enc)
        d = {
            "input_ids": torch.tensor(it.input_ids, dtype=torch.long),
            "loss_mask": torch.tensor([int(b) for b in it.loss_mask], dtype=torch.long),
            "hidden_state": last[None],
            "aux_hidden_state": aux[None],
        }
        return self._save(it, d)

    def close(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"files": f"rows_{{a}}-{{a+{ROWS_PER_FOLDER}}}/data_{{i}}.ckpt"}
        self.write_vocab(doc, "specforge")
        doc["sha256"] = dict(sorted(self.sums.items()))
        return doc


class ModelOpt(_TorchFiles):
    name = "modelopt"

    def bind(
        self, model: str, layers: Layers, files: list[Path], lm: LoadedModel | None = None
    ) -> None:
        self.model, self.layers, self.files = model, layers, files

    def prepare(self, items: Iterator[Item]) -> None:
        self.longest = max((len(it.input_ids) for it in items), default=0)

    def _longest(self) -> int:
        """The longest sample (read again where this layout did not prepare: Ray's merge)."""
        if not hasattr(self, "longest"):
            from .items import iter_items

            self.prepare(iter_items(self.files))
        return self.longest

    def path(self, index: int) -> Path:
        return self.out / modelopt_file(index)

    def write(self, it: Item, cap: Captured) -> Job:
        torch = self.torch
        last, aux = _normed_and_aux(cap, self.enc)
        d = offline_record(torch, it.id, it.input_ids, it.loss_mask, last, aux)
        return self._save(it, d)

    def close(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"files": "{i:08d}.pt", "sha256": dict(sorted(self.sums.items()))}
        layers = getattr(self, "layers", None)
        if layers is not None:  # a pass that bound a model: the recipe ModelOpt's main.py runs
            aux0 = [i - 1 for i in layers.aux]
            path, settings = write_modelopt_recipe(self.out, self.model, aux0, self._longest())
            doc["recipe"] = path.name
            doc["settings"] = [s.line() for s in settings]
        return doc


class Shards(_Files):
    """draftdata's own safetensors shards; a shard is closed at about ``shard_bytes`` of hidden
    states. With the zstd codec a shard is one zstd frame over the whole safetensors file
    (``hs-{first}-{last}.safetensors.zst``)."""

    name = "safetensors"
    #: the byte codecs this layout takes (the trainers' layouts take none: they read plain files)
    codecs = ("none", "zstd")

    def __init__(self, out: Path, torch: Any, enc: Encoder, shard_bytes: int = SHARD_BYTES):
        self.out, self.torch, self.enc, self.shard_bytes = out, torch, enc, shard_bytes
        self.suffix = ".safetensors" + SUFFIX[enc.codec]
        self.have: dict[int, tuple[str, list[int]]] = {}  # index -> (shard, ids) of earlier runs
        self.pending: list[tuple[Item, dict[str, Any]]] = []
        self.bytes = 0
        out.mkdir(parents=True, exist_ok=True)
        self._start_sums()
        for p in sorted(out.glob("hs-*" + self.suffix)):
            got = self._earlier(p)  # unreadable or changed: its samples are captured again
            if got is None:
                continue
            try:
                meta = json.loads(got[1].get("draftdata", "{}"))
                ids = got[0]["input_ids"].tolist()
                offs = got[0]["offsets"].tolist()
            except Exception:
                continue
            for n, index in enumerate(meta.get("indices", [])):
                self.have[int(index)] = (p.name, ids[offs[n] : offs[n + 1]])

    def prepare(self, items: Iterator[Item]) -> None:
        for _ in items:
            pass

    def done(self, it: Item) -> bool:
        got = self.have.get(it.index)
        return got is not None and got[1] == it.input_ids

    def write(self, it: Item, cap: Captured) -> Job:
        enc = _host(self.enc.encode(_stack(cap, self.torch)))
        self.pending.append((it, enc))
        self.bytes += sum(t.numel() * t.element_size() for t in enc.values())
        if self.bytes >= self.shard_bytes:
            return self.take()
        return lambda: 0

    def take(self) -> Job:
        """The pending samples as one shard's write (run by the caller, on any thread)."""
        pending, self.pending, self.bytes = sorted(self.pending, key=lambda p: p[0].index), [], 0
        return lambda: self._save(pending)

    def flush(self) -> None:
        self.take()()

    def _save(self, pending: list[tuple[Item, dict[str, Any]]]) -> int:
        if not pending:
            return 0
        from safetensors.torch import save

        torch = self.torch
        items = [it for it, _ in pending]
        lens = [len(it.input_ids) for it in items]
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + n)
        tensors: dict[str, Any] = {
            "input_ids": torch.tensor([t for it in items for t in it.input_ids], dtype=torch.long),
            "loss_mask": torch.tensor(
                [int(b) for it in items for b in it.loss_mask], dtype=torch.uint8
            ),
            "offsets": torch.tensor(offsets, dtype=torch.long),
        }
        for key in pending[0][1]:
            tensors[key] = torch.cat([e[key] for _, e in pending], dim=0)
        meta = {"indices": [it.index for it in items], "ids": [it.id for it in items]}
        name = f"hs-{items[0].index:08d}-{items[-1].index:08d}{self.suffix}"
        data = compress(save(tensors, metadata={"draftdata": json.dumps(meta)}), self.enc.codec)
        write_bytes(self.out / name, data)
        self.sums[name] = sha256_bytes(data)
        n = len(data)
        for it in items:
            self.have[it.index] = (name, it.input_ids)
        return n

    def close(self) -> dict[str, Any]:
        self.flush()
        by_shard: dict[str, list[int]] = {}
        for index, (name, _ids) in sorted(self.have.items()):
            by_shard.setdefault(name, []).append(index)
        doc = {"shards": [{"path": k, "indices": v} for k, v in sorted(by_shard.items())]}
        write_json(self.out / "index.json", doc)
        return {
            "files": "hs-*" + self.suffix,
            "index": "index.json",
            "sha256": {k: self.sums[k] for k in sorted(by_shard)},
        }


def make_layout(
    name: str,
    out: Path,
    torch: Any,
    dtype: str,
    codec: str = "none",
    options: dict[str, Any] | None = None,
) -> Any:
    """The layout the trainer ``name`` reads (``export.trainers.LAYOUTS``), its rules checked;
    ``options`` are the layout's own (``--top-k``, ... for NeMo Automodel's cache)."""
    trainer = layout_trainer(name, dtype)
    named = trainer.layout
    assert named is not None  # LAYOUTS holds only the trainers that name one
    module, _, attr = named.partition(":")
    layout = getattr(import_module(module), attr)
    if codec not in getattr(layout, "codecs", ("none",)):
        raise InputError(
            f"--codec {codec}: only draftdata's own shards (--for safetensors) take a byte "
            f"codec; {name}'s trainer reads its files uncompressed"
        )
    given = trainer.check_options(options)
    return layout(out, torch, Encoder(torch, dtype, codec), **given)
