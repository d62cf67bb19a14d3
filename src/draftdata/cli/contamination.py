"""CLI: ``draftdata contamination``, training prompts checked against evaluation sets."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import InputError
from .app import app, example, out, say

if TYPE_CHECKING:
    from ..measure.contamination import Detector, Match


@app.command(
    epilog=example(
        "draftdata contamination examples/demo/manifest.toml --against mt-bench",
        "draftdata contamination runs/demo/export --against mt-bench --against humaneval --json",
        "draftdata contamination manifest.toml --against gsm8k.jsonl",
    )
)
def contamination(
    source: Annotated[
        Path,
        typer.Argument(
            help="a run manifest (.toml: its datasets' prompts) or export shards (a folder "
            "or .parquet files: each sample's prompt, decoded)",
            metavar="MANIFEST|SHARDS",
        ),
    ],
    against: Annotated[
        list[str],
        typer.Option(
            "--against",
            help="an evaluation set, repeatable: mt-bench, humaneval, or a JSONL file of prompts",
        ),
    ],
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer", "-t", help="SHARDS: the tokenizer (default: the export's manifest's)"
        ),
    ] = None,
    first: Annotated[int, typer.Option(help="matches listed per dataset")] = 10,
    json_out: Annotated[bool, typer.Option("--json", help="print the outcome as JSON")] = False,
) -> None:
    """Flag training prompts that hold an evaluation prompt (>= 70% of its word 8-grams; a
    prompt under 8 words only verbatim), per dataset: how many, and the first matches."""
    from ..measure.contamination import Tally, detector_for
    from ..store.meta import contamination_json

    if not source.exists():
        raise InputError(f"{source}: no such manifest, export folder or shard file")
    is_manifest = source.is_file() and source.suffix == ".toml"
    det = detector_for(against, Path.cwd())
    tallies: dict[str, Tally] = {}
    found = (
        _manifest_prompts(source, det) if is_manifest else _shard_prompts(source, tokenizer, det)
    )
    for dataset, pid, match in found:
        tallies.setdefault(dataset, Tally(keep=max(first, 0))).add(pid, match)
    doc: dict[str, Any] = {
        "source": str(source),
        "against": [es.name for es in det.eval_sets],
        "eval_prompts": len(det),
        "n": det.n,
        "threshold": det.threshold,
        "datasets": {},
    }
    for name, t in tallies.items():
        doc["datasets"][name] = contamination_json(t.record())
    if json_out:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return
    unit = "prompts" if is_manifest else "samples"
    say(
        out,
        f"against {', '.join(doc['against'])} ({len(det)} evaluation prompts; word "
        f"{det.n}-grams, flagged at >= {det.threshold:.0%} of an evaluation prompt's)",
    )
    for name, d in doc["datasets"].items():
        by = ", ".join(f"{k}: {v}" for k, v in sorted(d["by_set"].items()))
        say(
            out,
            f"{name}: {d['flagged']} of {d['checked']} {unit} flagged" + (f" ({by})" if by else ""),
        )
        for f in d["first"]:
            say(out, f"  {f['prompt_id']}  {f['eval_set']} {f['eval_id']}  score {f['score']:.2f}")


def _manifest_prompts(path: Path, det: Detector) -> Iterator[tuple[str, str, Match | None]]:
    """(dataset, prompt id, match) of a manifest's datasets' prompts, read as a run reads them
    and checked as ``[run] decontaminate`` checks them (each user and system message)."""
    from ..config import load_manifest
    from ..generate.inputs import iter_dataset

    m = load_manifest(path)
    for d in m.datasets:
        drops: Counter[str] = Counter()
        for p in iter_dataset(m, d, drops):
            yield d.name, p.id, det.check_prompt(p)


def _shard_prompts(
    path: Path, tokenizer: str | None, det: Detector
) -> Iterator[tuple[str, str, Match | None]]:
    """(dataset, sample id, match) of every sample in export shards: its prompt ids decoded
    (chat markup included: an evaluation prompt under 8 words, matched only as a whole
    message, is not found in it)."""
    from ..export.shards import read_samples
    from ..export.write import read_export_manifest
    from ..tokenizers import load_tokenizer

    folder = path if path.is_dir() else path.parent
    spec = tokenizer
    if spec is None:
        if not (folder / "manifest.json").is_file():
            raise InputError(
                f"{path}: no manifest.json beside the shards to name their tokenizer; pass -t"
            )
        spec = read_export_manifest(folder).tokenizer.path
        if not spec:
            raise InputError(f"{folder}/manifest.json names no tokenizer path; pass -t")
    tok = load_tokenizer(spec)
    _, samples = read_samples(path)
    for s in samples:
        yield s.dataset, s.id, det.check(tok.decode(s.input_ids[: s.prompt_len]))
