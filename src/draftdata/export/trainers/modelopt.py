"""NVIDIA ModelOpt (``nvidia-modelopt``): the one place ModelOpt takes token ids is its offline
EAGLE-3 data, ``modelopt.torch.speculative.eagle.utils.OfflineSupervisedDataset``: one ``.pt``
per conversation, a dict with ``input_ids`` and ``loss_mask`` ``(seq_len,)`` int64,
``hidden_states`` ``(seq_len, H)`` (the last layer after the final norm, transformers'
``hidden_states[-1]``: unless the file says ``hidden_states_prenorm``, its offline forward takes
``lm_head(hidden_states)`` as the target's logits) and ``aux_hidden_states`` ``(seq_len, k*H)``
(the aux layers side by side, lowest first), read with ``torch.load(weights_only=True)``. Its online path
(``LanguageDataCollator``, the vLLM streaming dataset) re-renders ``messages`` with the chat
template and builds the mask from HF ``assistant_masks``, which needs ``{% generation %}`` tags.

``export --as modelopt`` writes the ids half of those files, ``modelopt/{n:08d}.pt`` in export
order with ``input_ids``, ``loss_mask`` (0/1) and ``id``; ``offline_record`` is the whole dict,
which ``hidden-states --for modelopt`` (``hidden.layouts.ModelOpt``) writes whole, with the two
hidden-state tensors, as ``OUT/{n:08d}.pt``. The dataset trains on the stored ``loss_mask`` only with
``answer_only_loss=True``; its default ignores it and trains every position.

Mask convention: the same mask as every export. ModelOpt distills (no labels): at TTT step 0
the draft's logits at position t are matched to the base model's distribution at t+1 under
``loss_mask[t+1]`` (step s: ``loss_mask[t+1+s]``), so the first proposal (the answer's first id)
is never trained: its first trained label is the answer's second id, as in speculators and NeMo
Automodel (SpecForge gates on ``loss_mask[t]``, one later). Layers: ModelOpt hooks decoder layers
``{1, L//2-1, L-4}`` (0-based), transformers' ``output_hidden_states`` ``[2, L//2, L-3]``, the
layers ``--layers auto`` captures (tests/test_hidden_modelopt.py checks both against its code)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...errors import InputError
from ...records import ExportManifest, Sample

#: the folder of ``.pt`` files under the export
FOLDER = "modelopt"


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise InputError(
            "ModelOpt reads torch .pt files; install torch with pip install 'draftdata[torch]'"
        ) from e
    return torch


def file_name(index: int) -> str:
    """The file of the ``index``-th sample of the export (its order)."""
    return f"{index:08d}.pt"


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
    """``folder/modelopt/``: one ``.pt`` per sample in export order (ids and masks), written to a
    folder beside it and swapped in whole."""
    torch = _torch()
    out = folder / FOLDER
    work = out.with_name(f".{out.name}.work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        for i, s in enumerate(samples):
            torch.save(offline_record(torch, s.id, s.input_ids, s.loss_mask), work / file_name(i))
        if out.exists():
            shutil.rmtree(out)
        os.replace(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return (out,)
