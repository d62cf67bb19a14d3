"""NVIDIA ModelOpt (``nvidia-modelopt``): the one place ModelOpt takes token ids is its offline
EAGLE-3 data, ``modelopt.torch.speculative.eagle.utils.OfflineSupervisedDataset``: one ``.pt``
per conversation, a dict with ``input_ids`` and ``loss_mask`` ``(seq_len,)`` int64,
``hidden_states`` ``(seq_len, H)`` (the last layer after the final norm, transformers'
``hidden_states[-1]``: unless the file says ``hidden_states_prenorm``, its offline forward takes
``lm_head(hidden_states)`` as the target's logits) and ``aux_hidden_states`` ``(seq_len, k*H)``
(the aux layers side by side, lowest first), read with ``torch.load(weights_only=True)``. Its online path
(``LanguageDataCollator``, the vLLM streaming dataset) re-renders ``messages`` with the chat
template and builds the mask from HF ``assistant_masks``, which needs ``{% generation %}`` tags.

``export --as modelopt`` writes the ids half of those files, ``modelopt/{n:08d}.ids.pth`` in
export order with ``input_ids``, ``loss_mask`` (0/1) and ``id``, and the settings ModelOpt needs
(``modelopt/draftdata-modelopt-settings.yaml``); ``offline_record`` is the whole dict, which
``hidden-states --for modelopt`` (``hidden.layouts.ModelOpt``) writes whole, with the two
hidden-state tensors, as ``OUT/{n:08d}.pt``. The ids half is named ``.ids.pth``, not ``.pt``:
ModelOpt's main.py trains on every ``*.pt`` under ``data.offline_data_path`` (``rglob``), and a
file without hidden states stops it (``KeyError: 'hidden_states'``) when that path is the run
folder. The dataset trains on the stored ``loss_mask`` only with ``answer_only_loss=True``; its
default ignores it and trains every position (``export.trainers.settings``).

Mask convention: the same mask as every export. ModelOpt distills (no labels): at TTT step 0
the draft's logits at position t are matched to the base model's distribution at t+1 under
``loss_mask[t+1]`` (step s: ``loss_mask[t+1+s]``), so the first proposal (the answer's first id)
is never trained: its first trained label is the answer's second id, as in speculators and NeMo
Automodel (SpecForge gates on ``loss_mask[t]``, one later). Layers: ModelOpt hooks decoder layers
``{1, L//2-1, L-4}`` (0-based), transformers' ``output_hidden_states`` ``[2, L//2, L-3]``, the
layers ``--layers auto`` captures (tests/test_hidden_modelopt.py checks both against its code)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...files import replacing_dir
from ...records import Sample
from ...records.export import ExportManifest

#: the folder of the ids-only files under the export
FOLDER = "modelopt"
#: their suffix: not ``.pt``, which ModelOpt's trainer globs for training files
IDS_SUFFIX = ".ids.pth"


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise InputError(
            "ModelOpt reads torch .pt files; install torch with pip install 'draftdata[torch]'"
        ) from e
    return torch


def file_name(index: int) -> str:
    """The training file of the ``index``-th sample (``hidden-states --for modelopt``)."""
    return f"{index:08d}.pt"


def ids_file_name(index: int) -> str:
    """The ids-only file of the ``index``-th sample of the export (``export --as modelopt``)."""
    return f"{index:08d}{IDS_SUFFIX}"


def offline_record(
    torch: Any,
    sample_id: str,
    input_ids: list[int],
    loss_mask: list[bool],
    hidden_states: Any = None,
    aux_hidden_states: Any = None,
) -> dict[str, Any]:
    """One ModelOpt offline ``.pt`` dict: ``input_ids`` and ``loss_mask`` int64 ``(seq,)``, and,
    where given, ``hidden_states`` ``(seq, H)`` and ``aux_hidden_states`` ``(seq, k*H)``."""
    rec: dict[str, Any] = {
        "id": sample_id,
        "input_ids": torch.tensor(input_ids, dtype=torch.int64),
        "loss_mask": torch.tensor([int(b) for b in loss_mask], dtype=torch.int64),
    }
    n = len(input_ids)
    for key, x in (("hidden_states", hidden_states), ("aux_hidden_states", aux_hidden_states)):
        if x is None:
            continue
        if x.dim() != 2 or x.shape[0] != n:
            raise InputError(f"{sample_id}: {key} of shape {tuple(x.shape)} for {n} ids")
        rec[key] = x.contiguous()
    return rec


def write_offline(
    samples: Iterable[Sample], manifest: ExportManifest, folder: Path
) -> tuple[Path, ...]:
    """``folder/modelopt/``: one ``.ids.pth`` per sample in export order (ids and masks) and the
    settings ModelOpt needs, written to a folder beside it and swapped in whole
    (``draftdata.files.replacing_dir``)."""
    from .settings import write_modelopt_export_settings

    torch = _torch()
    out = folder / FOLDER
    with replacing_dir(out) as work:
        longest = 0
        for i, s in enumerate(samples):
            rec = offline_record(torch, s.id, s.input_ids, s.loss_mask)
            torch.save(rec, work / ids_file_name(i))
            longest = max(longest, len(s.input_ids))
        write_modelopt_export_settings(work, longest)
    return (out,)
