"""``hidden-states --verify OUT --recipe FILE``: a trainer's own config checked against the capture
it will train on, before training. What the trainer will do is read from the config as the
trainer reads it, its defaults where a key is unset (``export.trainers.settings`` names them):

- the aux layers it will use, against the layers the states were captured at (a mismatch trains
  or serves the draft on other layers than it reads: sglang#25454 cost Kimi K2.5's drafter 0.10
  of acceptance length that way);
- the loss mask it will apply, against ours;
- where it reads the files, and the length it cuts samples at.

Both are printed either way; any mismatch is a ``RecipeMismatch`` (exit 1) naming the key."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DraftdataError, InputError
from ..export.trainers.settings import modelopt_aux_default, nemo_aux_default
from .items import iter_items
from .nemo_cache import NEMO_MANIFEST
from .read import read_manifest

__all__ = ["RecipeCheck", "RecipeMismatch", "check_recipe"]


class RecipeMismatch(DraftdataError):
    """A trainer's config would not train on the capture as it was made."""

    exit_code = 1


@dataclass
class RecipeCheck:
    trainer: str
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def say(self, ok: bool, line: str, problem: str = "") -> None:
        self.lines.append(("OK    " if ok else "WRONG ") + line)
        if not ok:
            self.problems.append(problem or line)


def _load(recipe: Path) -> dict[str, Any]:
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError as e:
        raise InputError("--recipe reads YAML: pip install pyyaml") from e
    try:
        doc = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"--recipe {recipe}: cannot read it ({e.strerror})") from e
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        raise InputError(f"--recipe {recipe}: not YAML ({where or e})") from e
    if not isinstance(doc, dict):
        raise InputError(f"--recipe {recipe}: not a YAML mapping of settings")
    return doc


def _get(doc: dict[str, Any], key: str, default: Any = None) -> Any:
    node: Any = doc
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _masks(capture: dict[str, Any]) -> tuple[int, int] | None:
    """(trained, total) tokens of the samples the capture read; None where they are gone."""
    inputs = [Path(p) for p in capture.get("inputs", [])]
    if not inputs or not all(p.exists() for p in inputs):
        return None
    trained = total = 0
    for it in iter_items(inputs):
        trained += sum(it.loss_mask)
        total += len(it.loss_mask)
    return trained, total


def _longest(capture: dict[str, Any]) -> int | None:
    inputs = [Path(p) for p in capture.get("inputs", [])]
    if not inputs or not all(p.exists() for p in inputs):
        return None
    return max((len(it.input_ids) for it in iter_items(inputs)), default=0)


def _ours(m: tuple[int, int] | None) -> str:
    return f"ours trains {m[0]:,} of {m[1]:,} tokens" if m else "ours (its export is gone)"


def _same_path(given: Any, out: Path) -> bool:
    return isinstance(given, str) and Path(given).expanduser().resolve() == out.resolve()


def _modelopt(c: RecipeCheck, doc: dict[str, Any], out: Path, capture: dict[str, Any]) -> None:
    n_layers = int(capture["layers"]["n_layers"])
    captured = list(capture["layers"]["modelopt_aux_layer_ids"])
    key = "eagle.eagle_architecture_config.eagle_aux_hidden_state_layer_ids"
    given = _get(doc, key)
    uses = list(given) if given else modelopt_aux_default(n_layers)
    whose = key if given else f"{key} unset: ModelOpt's default for {n_layers} layers"
    c.say(
        uses == captured,
        f"aux layers: ModelOpt will use {uses} ({whose}); the states were captured at "
        f"{captured} (0-based decoder layers; transformers hs {capture['layers']['aux']})",
        f"{key} is {uses}, the states were captured at {captured}: set it to {captured}",
    )
    masks = _masks(capture)
    if _get(doc, "training.answer_only_loss", False) is True:
        c.say(True, f"loss mask: ModelOpt will apply the stored loss_mask, {_ours(masks)}")
    else:
        total = f"all {masks[1]:,} tokens" if masks else "every token"
        c.say(
            False,
            f"loss mask: ModelOpt will apply all ones ({total}: training.answer_only_loss is "
            f"false, its default); {_ours(masks)}",
            "training.answer_only_loss is false (ModelOpt's default): its offline dataset "
            "replaces our loss_mask with all ones; set training.answer_only_loss: true",
        )
    path = _get(doc, "data.offline_data_path")
    ours = {p.resolve() for p in out.glob("*.pt")}
    found = {p.resolve() for p in Path(path).expanduser().rglob("*.pt")} if path else set()
    c.say(
        bool(path) and found == ours,
        f"data.offline_data_path: {path} ({len(found & ours)} of this capture's {len(ours)} "
        f"files, {len(found - ours)} others under it)",
        f"data.offline_data_path {path}: ModelOpt would train on every *.pt under it, "
        f"{len(found & ours)} of this capture's {len(ours)} files and {len(found - ours)} others; "
        f"point it at {out}",
    )
    longest, cut = _longest(capture), int(_get(doc, "training.training_seq_len", 2048))
    if longest is not None:
        c.say(
            cut >= longest,
            f"training.training_seq_len: {cut} (the longest sample: {longest})",
            f"training.training_seq_len {cut} cuts the samples past it (the longest: "
            f"{longest}); set it to {longest}",
        )


def _nemo(c: RecipeCheck, doc: dict[str, Any], out: Path, capture: dict[str, Any]) -> None:
    try:
        cache = json.loads((out / NEMO_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{out / NEMO_MANIFEST}: cannot read the cache's manifest ({e})") from e
    n_layers = int(capture["layers"]["n_layers"])
    captured = list(cache["aux_layer_ids"])
    given = _get(doc, "recipe_args.aux_layer_ids")
    uses = list(given) if given else nemo_aux_default(n_layers)
    whose = "recipe_args.aux_layer_ids" if given else f"its default for {n_layers} layers"
    c.say(
        uses == captured,
        f"aux layers: NeMo's recipe names {uses} ({whose}); the cache holds {captured} "
        f"(0-based decoder layers; transformers hs {capture['layers']['aux']})",
        f"recipe_args.aux_layer_ids is {uses}, the cache holds {captured}: set it to "
        f"{captured} (and serve the draft with them)",
    )
    masks = _masks(capture)
    wrong = [
        f"{k}: the recipe sets {bool(_get(doc, 'recipe_args.' + k, False))}, the cache was "
        f"built with {bool(cache.get(k, False))}"
        for k in ("mask_generation_prompt", "mask_reasoning_content")
        if bool(_get(doc, "recipe_args." + k, False)) != bool(cache.get(k, False))
    ]
    c.say(
        not wrong,
        "loss mask: NeMo applies the cache's loss_mask as stored, shifted one left, "
        + (_ours(masks) if not wrong else "but refuses this cache: " + "; ".join(wrong)),
        "NeMo refuses the cache (ensure_supervision_options_match): " + "; ".join(wrong),
    )
    path = _get(doc, "recipe_args.cached_target_path")
    c.say(
        _same_path(path, out),
        f"recipe_args.cached_target_path: {path}",
        f"recipe_args.cached_target_path is {path}, not this cache ({out})",
    )


CHECKS: dict[str, Callable[[RecipeCheck, dict[str, Any], Path, dict[str, Any]], None]] = {
    "modelopt": _modelopt,
    "nemo-automodel": _nemo,
}


def check_recipe(out: Path, recipe: Path) -> RecipeCheck:
    """The trainer config ``recipe`` against the capture in ``out``; raises nothing for a
    mismatch (the check lists it), only for a recipe or capture it cannot read."""
    capture = read_manifest(out)
    layout = str(capture.get("layout"))
    check = CHECKS.get(layout)
    if check is None:
        raise InputError(
            f"--recipe: {out} holds a {layout} capture; trainer configs are checked for "
            f"{' and '.join(CHECKS)} captures"
        )
    c = RecipeCheck(layout)
    check(c, _load(recipe), out, capture)
    return c
