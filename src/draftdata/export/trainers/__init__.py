"""The trainers, by name: the one table a new trainer is added to. Each entry holds what
draftdata writes for that trainer: its exports beside the shards (``export --as``, from
``EXPORTERS``) and its offline hidden-state layout (``hidden-states --for``, from ``LAYOUTS``),
with the dtypes that layout's reader takes.

An exporter's writer takes the export's samples (any iterable, read once), its
``ExportManifest`` and the folder, never a run; a lossy one, whose trainer re-tokenizes text,
takes the answered conversations and the format's system text instead. ``lossy`` says why the
trainer will not train on our ids (None: it trains on them exactly)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...records import Answered, Sample
from ...records.export import ExportManifest
from . import modelopt, nemo_automodel, specforge, speculators

#: an exact export: the samples in export order, the export's manifest, the folder
SampleWriter = Callable[[Iterable[Sample], ExportManifest, Path], tuple[Path, ...]]
#: a lossy export: the conversations that became samples, the format's system text, the folder
ConversationWriter = Callable[[Iterable[Answered], Path, "str | None"], tuple[Path, ...]]
#: the dtypes a hidden-state layout can store (``hidden.layouts`` encodes them)
DTYPES = ("bf16", "fp32", "fp8")


@dataclass(frozen=True)
class Exporter:
    #: the trainer's name, or the trainer's name and this export's suffix (``specforge-...``)
    name: str
    summary: str
    write: SampleWriter | None = None
    write_conversations: ConversationWriter | None = None
    #: why the trainer will not train on our ids (None: it trains on them exactly)
    lossy: str | None = None


@dataclass(frozen=True)
class Trainer:
    name: str
    exports: tuple[Exporter, ...] = ()
    #: the hidden-state layout class as "module:Class" (``hidden.layouts.Speculators`` ...),
    #: made by ``hidden.layouts.make_layout`` as ``(out, torch, encoder)``: named, not imported,
    #: because hidden/ sits above export/ (it reads an export)
    layout: str | None = None
    #: the stored dtypes its offline reader takes, and what to say to a dtype it does not
    dtypes: tuple[str, ...] = DTYPES
    dtype_hint: str = ""
    #: the layout's own options (``hidden-states --top-k`` ...), as its class takes them
    options: tuple[str, ...] = ()
    options_hint: str = "it takes none"
    #: whether ``hidden-states --ray`` can write the layout (each actor its own samples' files)
    ray: bool = True
    #: the number of aux layers its trainer takes (None: any)
    aux_layers: int | None = None

    def check_layers(self, spec: str) -> None:
        """``--layers spec`` against the aux layers the trainer takes (before a model loads)."""
        n = None if spec.strip() == "auto" else len(spec.split(","))
        if self.aux_layers is not None and n is not None and n != self.aux_layers:
            raise InputError(
                f"--layers {spec}: {self.name}'s EAGLE-3 takes exactly {self.aux_layers} aux "
                "layers; use --layers auto or i,j,k"
            )

    def check_options(self, options: dict[str, Any] | None) -> dict[str, Any]:
        """The options given (not None), each one this trainer's layout takes."""
        given = {k: v for k, v in (options or {}).items() if v is not None}
        wrong = sorted(set(given) - set(self.options))
        if wrong:
            flags = ", ".join("--" + k.replace("_", "-") for k in wrong)
            raise InputError(f"{flags}: not an option of --for {self.name} ({self.options_hint})")
        return given

    def check_dtype(self, dtype: str) -> None:
        if dtype not in DTYPES:
            raise InputError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        if dtype not in self.dtypes:
            raise InputError(f"--dtype {dtype}: {self.dtype_hint}")


def _trainer(name: str, *exports: Exporter, **kw: Any) -> Trainer:
    """A trainer whose exports are named after it: its own name, or ``NAME-SUFFIX``."""
    named = tuple(replace(e, name=f"{name}-{e.name}" if e.name else name) for e in exports)
    return Trainer(name, named, **kw)


TRAINERS: dict[str, Trainer] = {
    t.name: t
    for t in (
        _trainer(
            "speculators",
            Exporter(
                "",
                "our input_ids and loss_mask as JSONL (speculators prepare-data) and as a "
                "save_to_disk dataset (speculators-dataset/, its trainer and offline generation)",
                write=speculators.write_both,
            ),
            layout="draftdata.hidden.layouts:Speculators",
            options=("draft_vocab",),
            options_hint="--draft-vocab D writes the draft vocabulary speculators' --draft-vocab-size D "
            "builds (d2t-D.npy, t2d-D.npy) beside token_freq.pt",
        ),
        _trainer(
            "specforge",
            Exporter(
                "",
                "our input_ids and loss_mask as the pre-tokenized JSONL of SpecForge's "
                "data.prompts_path",
                write=specforge.write_pretokenized,
            ),
            Exporter(
                "conversations",
                "LOSSY: conversations that SpecForge re-tokenizes with the stock tokenizer",
                write_conversations=specforge.write_conversations,
                lossy=specforge.LOSSY,
            ),
            layout="draftdata.hidden.layouts:SpecForge",
            options=("draft_vocab",),
            options_hint="--draft-vocab D writes SpecForge's vocab_mapping.pt for a draft of D ids",
            dtypes=("bf16", "fp32"),
            dtype_hint="SpecForge reads bf16 or fp32 .ckpt files; use fp8 with --for speculators "
            "or --for safetensors",
        ),
        _trainer(
            "modelopt",
            Exporter(
                "",
                "our input_ids and loss_mask as the ids half of ModelOpt's offline .pt files "
                "(modelopt/, OfflineSupervisedDataset with answer_only_loss=True); it also needs "
                "hidden_states and aux_hidden_states, from a hidden-state layout",
                write=modelopt.write_offline,
            ),
            layout="draftdata.hidden.layouts:ModelOpt",
            # its collator stacks the tensors as stored and its draft's fc takes them as they
            # are: no fp8 scale is read anywhere (modelopt/torch/speculative/eagle/utils.py)
            dtypes=("bf16", "fp32"),
            dtype_hint="ModelOpt reads bf16 or fp32 .pt files (it has no fp8 scales); use fp8 "
            "with --for speculators or --for safetensors",
        ),
        _trainer(
            "nemo-automodel",
            Exporter(
                "",
                "our input_ids and loss_mask as NeMo Automodel's unshifted EAGLE-3 rows "
                "(build_packed_eagle3_dataset takes them; its recipe reads only conversations)",
                write=nemo_automodel.write_rows,
            ),
            Exporter(
                "conversations",
                "LOSSY: messages that NeMo Automodel's ChatDataset re-renders with the chat template",
                write_conversations=nemo_automodel.write_conversations,
                lossy=nemo_automodel.LOSSY,
            ),
            # the offline cache its recipe reads (recipe_args.cached_target_path)
            layout="draftdata.hidden.nemo_cache:NemoCache",
            dtypes=("bf16", "fp32"),
            dtype_hint="NeMo Automodel's cache is bf16 or fp32 here (its reader takes no fp8 "
            "scale); use fp8 with --for speculators or --for safetensors",
            options=("draft_vocab", "top_k", "shard_size"),
            options_hint="--draft-vocab, --top-k and --shard-size are NeMo Automodel's",
            # its shards each hold a fixed run of samples, written by one process
            ray=False,
            aux_layers=3,
        ),
        # draftdata's own hidden-state shards (read with safetensors); the shards are the export
        _trainer("safetensors", layout="draftdata.hidden.layouts:Shards"),
    )
}

#: ``export --as`` NAME: every trainer's exports
EXPORTERS: dict[str, Exporter] = {e.name: e for t in TRAINERS.values() for e in t.exports}
#: ``hidden-states --for`` NAME: the trainers with a hidden-state layout
LAYOUTS: dict[str, Trainer] = {n: t for n, t in TRAINERS.items() if t.layout is not None}


def layout_trainer(name: str, dtype: str) -> Trainer:
    """The trainer of the layout ``--for name``, its rules checked for ``dtype``."""
    t = LAYOUTS.get(name)
    if t is None:
        raise InputError(f"--for {name!r}: choose one of {', '.join(LAYOUTS)}")
    t.check_dtype(dtype)
    return t


__all__ = ["DTYPES", "EXPORTERS", "LAYOUTS", "TRAINERS", "Exporter", "Trainer", "layout_trainer"]
