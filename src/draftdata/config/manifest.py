"""The run manifest (TOML): one file lists the target model, the backends and the datasets.

Unknown keys and bad values are refused with the file, the line, the key and the fix. Plain
models: nothing here imports a stage (the readers' and backends' names are tables of data here,
which ``sources`` and ``generate.backends`` register against)."""

from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import DraftdataError
from ..files import not_a_file, resolve_path
from ..nesting import TooDeep, loads_toml
from ..records import Decoding
from .backends import (
    BACKENDS,
    BackendCfg,
    backend_union,
    follow_backends,
    load_plugins,
    redact_url,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ManifestError(DraftdataError):
    """The run manifest is missing, unreadable or invalid."""


#: ``[[datasets]] reader``: the names ``sources.READERS`` registers a reader under, one each
#: (``sources.reader`` refuses a name not here, and a test checks that every one has a reader)
READER_NAMES = frozenset(
    {
        "bfcl",
        "glaive",
        "humaneval",
        "magicoder-evol",
        "magicoder-oss",
        "mtbench",
        "openai",
        "openai-messages",
        "parquet",
        "sharegpt",
        "ultrachat",
        "writingbench",
    }
)


#: ``[run] drop``: the quality checks of the tokens stage (``tokens.quality.QUALITY_CHECKS``
#: names them, and a test checks the two lists agree) whose samples are dropped, not kept
QualityCheck = Literal[
    "repetition_loop",
    "truncated",
    "empty_answer",
    "think_unclosed",
    "near_duplicate_answer",
    "language_mismatch",
    "count_mismatch",
]
QUALITY_CHECK_NAMES: tuple[str, ...] = get_args(QualityCheck)
#: ``[run] decontaminate``: the built-in evaluation sets (``measure.contamination.BUILTIN_SETS``);
#: any other entry is a JSONL file of evaluation prompts
EVAL_SET_NAMES = ("mt-bench", "humaneval")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sampling(_Strict):
    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(256, ge=1, le=1_000_000)
    seed: int = 0

    @property
    def decoding(self) -> Decoding:
        """How these settings decode, as the repair and the gate read it."""
        return Decoding(self.temperature, self.top_p)


class RunCfg(_Strict):
    name: str
    output: str
    budget_usd: float | None = Field(None, ge=0)
    min_exact: float = Field(0.9, ge=0.0, le=1.0)
    #: a text-only dataset stops once more than this share of its answers (after the first
    #: ``count_probe``) carry ``count_mismatch``: the server's own token counts disagree with
    #: the ids reconstructed from its text (``generate.count_watch``); 1 never stops one. Set
    #: for what breaks every answer (a wrong format, tokenizer or server profile): SmolLM2's
    #: text alone leaves 12% of its answers wrong, nearly all of them flagged
    max_count_mismatch: float = Field(0.3, ge=0.0, le=1.0)
    #: the answers a text-only dataset is judged on before that share can stop it
    count_probe: int = Field(50, ge=1)
    #: learn split preferences from the ground-truth datasets and apply them when text answers
    #: are reconstructed; the gate then measures them cross-validated (learned on one half of the
    #: prompts, measured on the other)
    learn_prefs: bool = False
    #: an existing ground-truth JSONL (exact ids from the target) that serves as the gate's
    #: evidence, alone or beside the run's own ground-truth datasets
    ground_truth: str | None = None
    #: quality checks whose samples are dropped (counted as ``quality:<check>``); the others
    #: stay warnings on their samples (``draftdata export --drop`` can still filter them)
    drop: list[QualityCheck] = []
    #: evaluation sets (a built-in name, or a JSONL file) whose prompts are dropped when read,
    #: before any is asked (counted as ``contaminated:<set>``)
    decontaminate: list[str] = []
    #: write the run into ``output`` although it is a filesystem root or a folder holding
    #: files that are not a draftdata run (refused otherwise: the run would mix with them)
    force_output: bool = False


class TargetCfg(_Strict):
    tokenizer: str
    format: str
    model: str = "target"
    chat_template: str | None = None
    thinking: bool | None = None
    prefs: str | None = None  # split preferences from `draftdata learn`, applied to reconstruction


class DatasetCfg(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    source: str
    reader: str
    backend: str
    limit: int | None = Field(None, ge=1)
    samples_per_prompt: int = Field(1, ge=1, le=1000)
    #: all: every user turn answered on-policy, a sample per turn; joined: asked the same way,
    #: one sample per conversation with every answer trained; first / last: one turn
    turns: Literal["all", "joined", "first", "last"] = "all"
    sampling: Sampling = Sampling()
    columns: dict[str, str] = {}
    ground_truth: bool | None = None
    #: "native": tool schemas go to the format's own tool prompt; "system": they are written
    #: into a system message as text (for formats whose template has no tool prompt)
    tools_prompt: Literal["native", "system"] = "native"
    #: a system message put first in every prompt that has none (in place of the format's
    #: default one); a prompt's own system message is kept
    system: str | None = Field(None, min_length=1)
    #: a prompt with more text than this (characters of messages and tool schemas) is skipped
    #: as prompt_too_large: one huge record must not take the run's memory
    max_prompt_chars: int = Field(1_000_000, ge=1)


class ModelCfg(_Strict):
    """The target model itself, for the model stage: score every sample after the tokens stage
    and, with ``repair``, fix reconstructed splits the model did not make."""

    path: str
    device: str = "cpu"
    repair: bool = False
    #: flag tokens whose log-probability is below this
    threshold: float = -12.0


class Manifest(_Strict):
    run: RunCfg
    target: TargetCfg
    backends: dict[str, BackendCfg]
    datasets: list[DatasetCfg]
    model: ModelCfg | None = None

    #: where the manifest lives; relative paths in it are relative to this folder
    base_dir: Path = Path(".")
    path: Path = Path("manifest.toml")

    def resolve(self, p: str) -> Path:
        if p.startswith("pkg:"):
            return resolve_path(p)
        q = Path(p).expanduser()
        return Path(os.path.normpath(q if q.is_absolute() else self.base_dir / q))

    @property
    def output_dir(self) -> Path:
        return self.resolve(self.run.output)

    def dataset(self, name: str) -> DatasetCfg:
        for d in self.datasets:
            if d.name == name:
                return d
        raise ManifestError(
            f"{self.path}: no dataset named {name!r}; the manifest has "
            f"{', '.join(d.name for d in self.datasets)}"
        )

    def is_ground_truth(self, d: DatasetCfg) -> bool:
        """Generated with exact ids by the target itself (a local engine), unless the manifest
        says."""
        if d.ground_truth is not None:
            return d.ground_truth
        return BACKENDS[self.backends[d.backend].kind].exact_ids


_FIELDS: dict[str, list[str]] = {
    "run": list(RunCfg.model_fields),
    "target": list(TargetCfg.model_fields),
    "datasets": list(DatasetCfg.model_fields),
    "sampling": list(Sampling.model_fields),
    "model": list(ModelCfg.model_fields),
    **{k: list(b.config.model_fields) for k, b in BACKENDS.items()},
}
#: the names pydantic puts into an error's location for a tagged union's members
_UNION_TAGS = {*BACKENDS, *(b.config.__name__ for b in BACKENDS.values())}


def _follow() -> None:
    """The manifest model, and its error messages' tables, follow ``BACKENDS`` (a kind
    registered or unregistered)."""
    union = backend_union()
    backends: Any = dict[str, union]  # type: ignore[valid-type]
    Manifest.model_fields["backends"].annotation = backends
    Manifest.model_rebuild(force=True)
    # the key hints and the union tags an error's location is cleaned of
    _FIELDS.update({k: list(b.config.model_fields) for k, b in BACKENDS.items()})
    _UNION_TAGS.update({*BACKENDS, *(b.config.__name__ for b in BACKENDS.values())})


follow_backends(_follow)


def load_manifest(path: Path) -> Manifest:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such manifest; see examples/ for one to copy") from None
    except OSError as e:
        raise ManifestError(f"{path}: cannot read ({e.strerror})") from e
    except UnicodeDecodeError as e:
        raise ManifestError(
            f"{path}: not a manifest (byte {e.start} is not UTF-8 text); pass the run's TOML "
            "manifest (`draftdata init` writes one)"
        ) from None
    try:
        raw = loads_toml(text)
    except TooDeep as e:
        raise ManifestError(f"{path}: invalid TOML: {e}; fix the manifest") from None
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"{path}: invalid TOML: {e}") from e
    _check_no_nul(raw, path, text)
    load_plugins()  # installed backend kinds register themselves before the kinds are checked
    _check_backend_kinds(raw, path, text)
    try:
        m = Manifest.model_validate(raw)
    except ValidationError as e:
        raise ManifestError(_explain(e, raw, path, text)) from None
    m.base_dir = path.resolve().parent
    m.path = path
    _check_output(m, path, text)
    names = [d.name for d in m.datasets]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ManifestError(f"{path}: dataset names must be unique; {sorted(dup)} repeat")
    for d in m.datasets:
        kind = not_a_file(m.resolve(d.source)) if not d.source.startswith("pkg:") else None
        if kind is not None:
            line = _line_of(text, ["datasets", names.index(d.name), "source"])
            raise ManifestError(
                f"{path}:{line}: datasets.{d.name}.source = {d.source!r} is not a regular file "
                f"({kind}: a run reads its source more than once, and this one may never end); "
                "save the prompts to a file and name that"
            )
        if d.reader not in READER_NAMES:
            line = _line_of(text, ["datasets", names.index(d.name), "reader"])
            close = difflib.get_close_matches(d.reader, sorted(READER_NAMES), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ManifestError(
                f"{path}:{line}: datasets.{d.name}.reader = {d.reader!r} is not a reader; "
                f"{hint}choose one of {', '.join(sorted(READER_NAMES))}"
            )
        if d.backend not in m.backends:
            line = _line_of(text, ["datasets", names.index(d.name), "backend"])
            raise ManifestError(
                f"{path}:{line}: datasets.{d.name}.backend = {d.backend!r} is not defined; "
                f"define [backends.{d.backend}] or use one of {sorted(m.backends)}"
            )
    return m


#: what a run folder holds from the first write on: its ledger, or the lock taken before it
#: (``store.lock.LOCK_NAME``)
RUN_MARKERS = ("ledger.sqlite", ".draftdata.lock")


def _check_output(m: Manifest, path: Path, text: str) -> None:
    """``[run] output`` is refused where the run would write among files not its own: a
    filesystem root, or a folder holding files and no run (unless ``force_output``)."""
    out = m.output_dir
    if m.run.force_output or out.is_file():  # a file there is said by the writer
        return
    where = f"{path}:{_line_of(text, ['run', 'output'])}: run.output = {m.run.output!r}"
    force = "or set [run] force_output = true"
    if out == Path(out.anchor):
        raise ManifestError(
            f"{where} is the filesystem root; name a folder of the run's own (e.g. runs/NAME), "
            f"{force}"
        )
    try:
        if not out.is_dir() or any((out / name).exists() for name in RUN_MARKERS):
            return
        first = next(out.iterdir(), None)
    except OSError:  # unreadable: the writer says why
        return
    if first is not None:
        raise ManifestError(
            f"{where}: {out} holds files and is not a draftdata run (it has {first.name!r}); "
            f"name a new or empty folder, {force} to write beside them"
        )


def _check_no_nul(raw: dict[str, Any], path: Path, text: str) -> None:
    """A NUL byte (``\\u0000``) in any string of the manifest is refused: no path, URL or name
    holds one, and the OS refuses a path that does."""
    stack: list[tuple[list[Any], Any]] = [([], raw)]
    while stack:
        loc, node = stack.pop()
        if isinstance(node, str) and "\x00" in node:
            key = ".".join(str(k) for k in loc)
            line = _line_of(text, loc)
            raise ManifestError(
                f"{path}{f':{line}' if line else ''}: {key} holds a NUL byte (\\u0000); "
                "no path or name can hold one: remove it"
            )
        items = (
            node.items()
            if isinstance(node, dict)
            else enumerate(node)
            if isinstance(node, list)
            else ()
        )
        stack.extend(([*loc, k], v) for k, v in items)


def _check_backend_kinds(raw: dict[str, Any], path: Path, text: str) -> None:
    for name, b in (raw.get("backends") or {}).items():
        kind = b.get("kind") if isinstance(b, dict) else None
        if kind not in BACKENDS:
            line = _line_of(text, ["backends", name, "kind"])
            raise ManifestError(
                f"{path}:{line}: backends.{name}.kind = {kind!r}; set kind to "
                f"one of {', '.join(BACKENDS)}"
            )


def _explain(e: ValidationError, raw: dict[str, Any], path: Path, text: str) -> str:
    err = e.errors()[0]
    loc = [p for p in err["loc"] if p not in _UNION_TAGS]
    # pydantic's union tags look like 'function-after[...]'; keep the real path
    loc = [p for p in loc if not (isinstance(p, str) and "[" in p)]
    key = ".".join(str(p) for p in loc)
    line = _line_of(text, loc)
    where = f"{path}:{line}" if line else str(path)
    if err["type"] == "extra_forbidden":
        section = _section_kind(loc, raw)
        close = difflib.get_close_matches(str(loc[-1]), _FIELDS.get(section, []), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "; remove it"
        return f"{where}: unknown key {key!r}{hint}"
    if err["type"] == "missing":
        return f"{where}: {key} is required; add it"
    got = err.get("input")
    if isinstance(got, str) and (loc[-1:] == ["base_url"] or "://" in got):
        got = redact_url(got)  # pydantic quotes the value: never a password or a key
    msg = str(err["msg"]).removeprefix("Value error, ")  # pydantic's words for our ValueError
    return f"{where}: {key}: {msg} (got {got!r})"


def _section_kind(loc: list[Any], raw: dict[str, Any]) -> str:
    if loc and loc[0] == "backends" and len(loc) > 1:
        b = raw.get("backends", {}).get(loc[1], {})
        return str(b.get("kind", ""))
    if "sampling" in loc:
        return "sampling"
    return str(loc[0]) if loc else ""


def _line_of(text: str, loc: list[Any]) -> int | None:
    """Best-effort line number of a manifest key: find its table header, then the key."""
    lines = text.splitlines()
    start = 0
    if loc and loc[0] == "datasets" and len(loc) > 1 and isinstance(loc[1], int):
        seen = -1
        for i, ln in enumerate(lines):
            if ln.strip().startswith("[[datasets]]"):
                seen += 1
                if seen == loc[1]:
                    start = i
                    break
        keys = [str(k) for k in loc[2:]]
    elif loc and loc[0] == "backends" and len(loc) > 1:
        for i, ln in enumerate(lines):
            if ln.strip() == f"[backends.{loc[1]}]":
                start = i
                break
        keys = [str(k) for k in loc[2:]]
    else:
        for i, ln in enumerate(lines):
            if loc and ln.strip() == f"[{loc[0]}]":
                start = i
                break
        keys = [str(k) for k in loc[1:]]
    if not keys:
        return start + 1
    for i in range(start, len(lines)):
        if re.match(rf"^\s*{re.escape(keys[0])}\s*=", lines[i]) or re.search(
            rf"[{{,]\s*{re.escape(keys[-1])}\s*=", lines[i]
        ):
            return i + 1
    return start + 1
