"""EAGLE-3 hidden states through the engine that serves the target (``hidden-states --server``):
vLLM's own extraction, for a target no transformers replica can hold (Kimi K2.5 behind vLLM with
tensor and expert parallelism, across machines).

The server runs vLLM's ``extract_hidden_states`` speculative method with the
``eagle_aux_hidden_state_layer_ids`` asked for (``[*aux, L]``, the numbering draftdata uses:
vLLM's Llama-style models keep ``hidden_states + residual`` after layer ``i - 1`` as id ``i``, so
id ``L`` is the last layer before the final norm) and a hidden-states KV connector
(``capture_args`` gives the flags; speculators' ``launch_vllm.py`` starts it the same way).
Every sample is one ``POST /v1/completions`` with its ids as the prompt (no re-tokenization),
``max_tokens=1``, ``prompt_logprobs=0`` (the verification's log-probabilities, from the same
forward) and ``return_token_ids``; the connector writes the prompt's states to
``shared_storage_path`` and answers the file's path in ``kv_transfer_params``. draftdata waits
for the writer's lock, reads the file (``hidden_states`` [S, k+1, H], ``token_ids`` [S]), checks
its ids and shape, deletes it, and hands the states to the same layouts the in-process capture
writes. The file is read from the path the server names: run draftdata where that storage is
mounted at the same path.

The final norm is not in vLLM's file: SpecForge's and ModelOpt's layouts store the last layer
after it, computed here as the model's RMSNorm does (float32, then the weight) from the norm's
weight and epsilon read from the model folder (one small tensor: no load)."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import redact_url
from ..errors import InputError
from ..generate.scoring import CONCURRENCY, MAX_RETRIES, TIMEOUT_S, ServerScorer
from ..generate.server_rows import parse_vllm
from ..model.folders import ModelError
from .capture import Captured
from .layers import Layers

__all__ = [
    "EngineCapturer",
    "EngineTarget",
    "FinalNorm",
    "capture_args",
    "final_norm",
    "open_engine",
]

#: the server's own connector (vLLM, GPU builds) and draftdata's CPU-build twin
STOCK_CONNECTOR = "ExampleHiddenStatesConnector"
CPU_CONNECTOR = "CPUHiddenStatesConnector"
CPU_CONNECTOR_MODULE = "draftdata.hidden.vllm_connector"
#: how often to look whether the connector has finished writing a file
LOCK_POLL_S = 0.005
#: the layouts that store the last layer after the final norm (``layouts._normed_and_aux``)
NORMED_LAYOUTS = ("specforge", "modelopt")


def capture_args(layers: Layers, storage: str, *, cpu: bool = False) -> list[str]:
    """The vLLM server flags that make it capture ``layers`` into ``storage``: the
    ``extract_hidden_states`` method and the stock connector (``cpu``: draftdata's CPU-build
    connector, ``hidden/vllm_connector.py``, which the server must be able to import)."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": [*layers.aux, layers.last]}
        },
    }
    kv: dict[str, Any] = {
        "kv_connector": CPU_CONNECTOR if cpu else STOCK_CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": storage},
    }
    if cpu:
        kv["kv_connector_module_path"] = CPU_CONNECTOR_MODULE
    return [
        "--speculative-config",
        json.dumps(spec, separators=(",", ":")),
        "--kv-transfer-config",
        json.dumps(kv, separators=(",", ":")),
    ]


@dataclass(frozen=True)
class FinalNorm:
    """The target's final RMSNorm: ``weight * (x * rsqrt(mean(x^2) + eps))``, in float32 and
    cast back before the weight, as transformers' Llama, Qwen and DeepSeek norms compute it."""

    torch: Any
    weight: Any
    eps: float

    def __call__(self, x: Any) -> Any:
        torch = self.torch
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(x.dtype) * h.to(x.dtype)


def _config(folder: Path) -> dict[str, Any]:
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{folder}: no readable config.json ({e})") from e
    if not isinstance(cfg, dict):
        raise InputError(f"{folder}/config.json is not an object")
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else cfg


def vocab_size_of(folder: Path) -> int:
    n = _config(folder).get("vocab_size")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"{folder}/config.json has no vocab_size")
    return n


def final_norm(folder: Path, torch: Any) -> FinalNorm:
    """The final norm's weight (``model.norm.weight``, or the one key ending in it) and
    epsilon (``rms_norm_eps``) from the model folder's config and safetensors."""
    from safetensors import safe_open

    cfg = _config(folder)
    kind = str(cfg.get("model_type", ""))
    eps = cfg.get("rms_norm_eps")
    if kind.startswith("gemma") or not isinstance(eps, int | float):
        raise ModelError(
            f"{folder}: no plain RMSNorm final norm draftdata knows (model_type {kind!r}, "
            f"rms_norm_eps {eps!r}); --for speculators or safetensors store the last layer "
            "before the norm and need none"
        )
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        where = {str(k): str(v) for k, v in json.loads(index.read_text())["weight_map"].items()}
    else:
        where = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                where.update({k: f.name for k in st.keys()})  # noqa: SIM118 (not a dict)
    names = [k for k in where if k == "model.norm.weight" or k.endswith(".model.norm.weight")]
    if len(names) != 1:
        raise ModelError(
            f"{folder}: {len(names)} final-norm weights (model.norm.weight) among its "
            f"safetensors ({', '.join(names) or 'none'}); --for speculators or safetensors "
            "need none"
        )
    with safe_open(str(folder / where[names[0]]), "pt") as st:
        return FinalNorm(torch, st.get_tensor(names[0]), float(eps))


@dataclass
class EngineTarget:
    """What a capture pass needs of its target when the engine is a server: the ids' bounds
    (the folder's vocabulary, the server's context less the one token it generates) and, once
    the first file is read, the dtype the server computes in."""

    spec: str
    folder: Path
    torch: Any
    vocab_size: int
    max_positions: int | None
    capturer: EngineCapturer
    device: str = "vllm"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> str:
        return self.capturer.served_dtype

    def capturer_for(self, layout: Any) -> EngineCapturer:
        """The capturer, for a layout it can feed: the server gives hidden states and each
        token's log-probability, not the logits a layout that keeps the target's distribution
        needs (NeMo Automodel's cache)."""
        if getattr(layout, "keep_logits", False):
            raise InputError(
                f"--for {layout.name} stores the target's next-token distribution, which vLLM's "
                "API does not return (only each prompt token's top log-probabilities); capture "
                "it with --model in this process, or through the server --for speculators, "
                "specforge, modelopt or safetensors"
            )
        return self.capturer

    def to_json(self) -> dict[str, Any]:
        c = self.capturer
        return {
            "kind": "vllm",
            "method": "extract_hidden_states",
            "base_url": redact_url(c.base_url),
            "model": c.model,
            "served_dtype": c.served_dtype,
            "requests": c.requests,
            "tokens_forwarded": c.tokens_forwarded,
            **self.meta,
        }


class EngineCapturer(ServerScorer):
    """``Capturer``'s interface over a vLLM server that extracts hidden states."""

    def __init__(
        self,
        base_url: str,
        layers: Layers,
        torch: Any,
        norm: FinalNorm | None,
        *,
        headers: dict[str, str] | None = None,
        model: str | None = None,
        engine: str | None = None,
        concurrency: int = CONCURRENCY,
        max_retries: int = MAX_RETRIES,
        timeout: float = TIMEOUT_S,
    ) -> None:
        super().__init__(
            base_url,
            headers=headers,
            model=model,
            engine=engine,
            top_k=0,
            concurrency=concurrency,
            max_retries=max_retries,
            timeout=timeout,
        )
        if self.engine != "vllm":
            raise ModelError(
                f"{base_url} is an {self.engine} server: only vLLM extracts hidden states "
                "through its engine (extract_hidden_states); capture with --model alone instead"
            )
        self.layers, self.torch, self.norm = layers, torch, norm
        self.served_dtype = "unknown"

    def _flags(self) -> str:
        return shlex.join(capture_args(self.layers, "/shared/hidden-states"))

    def one(self, ids: Sequence[int]) -> Captured:
        """One sample's states: the request, the file the connector wrote, checked and removed."""
        url = self.base_url + "/completions"
        body = {
            "model": self.model,
            "prompt": list(ids),
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        }
        doc = self._post(url, json.dumps(body).encode(), len(ids))
        try:
            params = doc.get("kv_transfer_params")
            path = params.get("hidden_states_path") if isinstance(params, dict) else None
            echoed = doc["choices"][0].get("prompt_token_ids")
            logprobs = [p.lp for p in parse_vllm(doc, ids, 0)]
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as e:
            raise ModelError(f"{url}: an answer draftdata cannot read ({e})") from e
        if not isinstance(path, str) or not path:
            raise ModelError(
                f"{url} returned no hidden_states_path (kv_transfer_params "
                f"{json.dumps(params)[:200]}): the server does not extract hidden states; start "
                f"vLLM with {self._flags()} (on vLLM's CPU build, kv_connector "
                f"{CPU_CONNECTOR} from {CPU_CONNECTOR_MODULE})"
            )
        if echoed is not None and list(echoed) != list(ids):
            raise ModelError(f"{url} ran other ids than the {len(ids)} it was sent")
        got = self._read(Path(path))
        return self._captured(Path(path), got, ids, logprobs)

    def _read(self, path: Path) -> dict[str, Any]:
        from safetensors.torch import load_file

        lock = Path(str(path) + ".lock")
        deadline = time.monotonic() + self.timeout
        if lock.exists():
            fd = os.open(lock, os.O_RDONLY)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise ModelError(
                                f"{path}: the server did not finish writing it in "
                                f"{self.timeout:.0f} s"
                            ) from None
                        time.sleep(LOCK_POLL_S)
            finally:
                os.close(fd)
        try:
            got = load_file(str(path), device="cpu")
        except FileNotFoundError:
            raise ModelError(
                f"{path}: the server wrote this sample's hidden states there and this machine "
                "cannot read it; run draftdata where the server's shared_storage_path is "
                "mounted at the same path"
            ) from None
        except Exception as e:
            raise ModelError(f"{path}: not a hidden-states file draftdata can read ({e})") from e
        for p in (path, lock):
            p.unlink(missing_ok=True)
        return got

    def _captured(
        self, path: Path, got: dict[str, Any], ids: Sequence[int], logprobs: list[float]
    ) -> Captured:
        hs, tok = got.get("hidden_states"), got.get("token_ids")
        k = len(self.layers.aux)
        if tok is None or tok.tolist() != list(ids):
            raise ModelError(f"{path}: its token_ids are not the {len(ids)} ids sent")
        if hs is None or hs.dim() != 3 or hs.shape[0] != len(ids) or hs.shape[1] != k + 1:
            shape = None if hs is None else list(hs.shape)
            raise ModelError(
                f"{path}: hidden_states {shape}, not [{len(ids)}, {k + 1}, H] (aux "
                f"{list(self.layers.aux)} and the last layer {self.layers.last}); start vLLM "
                f"with {self._flags()}"
            )
        self.served_dtype = str(hs.dtype).removeprefix("torch.")
        last = hs[:, k]
        normed = self.norm(last) if self.norm is not None else None
        return Captured(hs[:, :k], last, normed, logprobs)

    def capture(self, seqs: Sequence[Sequence[int]]) -> Iterator[tuple[int, Captured]]:
        """``(i, Captured)`` as the server answers, at most ``concurrency`` samples held."""
        todo = iter(range(len(seqs)))
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="hs-engine") as pool:
            running: dict[Future[Captured], int] = {}
            try:
                for i in todo:
                    running[pool.submit(self.one, seqs[i])] = i
                    if len(running) >= self.concurrency:
                        break
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for f in done:
                        i = running.pop(f)
                        yield i, f.result()
                        nxt = next(todo, None)
                        if nxt is not None:
                            running[pool.submit(self.one, seqs[nxt])] = nxt
            finally:
                for f in running:
                    f.cancel()

    def close(self) -> None:
        return None


def open_engine(
    server: str,
    folder: Path,
    layers: Layers,
    layout: str,
    *,
    backends: Mapping[str, Any] | None = None,
    target_model: str | None = None,
) -> EngineTarget:
    """The engine behind ``server``: a base URL, or the name of one of the run's manifest
    backends (its server, key, concurrency, retries and timeout). ``folder`` is the served
    model's folder: its config (vocabulary) and, for SpecForge and ModelOpt, its final norm."""
    from ..config import OpenAIBackendCfg
    from ..generate.backends.serving import ENGINES, auth_headers, served
    from ..generate.scoring import is_server

    try:
        import torch
    except ImportError as e:
        raise ModelError("hidden states need torch: pip install 'draftdata[hidden]'") from e
    opts: dict[str, Any] = {}
    url = server
    if not is_server(server):
        cfg = (backends or {}).get(server)
        if cfg is None:
            names = ", ".join(sorted(backends or {})) or "none: give a run"
            raise InputError(
                f"--server {server}: neither a base URL (http://HOST:PORT/v1) nor a backend of "
                f"the run's manifest ({names})"
            )
        if not isinstance(cfg, OpenAIBackendCfg):
            raise InputError(f"--server {server}: a {cfg.kind} backend; name a vLLM server's")
        url = cfg.base_url
        opts = {
            "headers": auth_headers(cfg),
            "model": cfg.model or target_model,
            "engine": cfg.server if cfg.server in ENGINES else None,
            "concurrency": cfg.concurrency,
            "max_retries": cfg.max_retries,
            "timeout": max(cfg.timeout_s, TIMEOUT_S),
        }
    norm = final_norm(folder, torch) if layout in NORMED_LAYOUTS else None
    cap = EngineCapturer(url, layers, torch, norm, **opts)
    got = served(cap.base_url, cap.headers, cap.model)
    context = got.max_model_len if got is not None else None
    meta = {
        "eagle_aux_hidden_state_layer_ids": [*layers.aux, layers.last],
        "final_norm": "computed here from the folder's model.norm.weight" if norm else None,
    }
    return EngineTarget(
        f"{redact_url(cap.base_url)}#{cap.model}",
        folder,
        torch,
        vocab_size_of(folder),
        # the server generates one token after the prompt: the prompt must leave room for it
        context - 1 if context else None,
        cap,
        meta=meta,
    )
