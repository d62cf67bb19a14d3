"""What a trainer must be told to train on our files as they are, said where the files are made:
printed by ``export --as`` and ``hidden-states --for``, written as a config snippet beside the
files, warned of by ``plan --hidden-for``, and checked against a capture by
``hidden-states --verify OUT --recipe FILE`` (``hidden.recipe_check``).

Each setting is a key of the trainer's own YAML config, dotted:

- ModelOpt (``nvidia-modelopt`` 0.47.0): its ``examples/speculative_decoding/main.py`` takes one
  recipe YAML (``--config``; ``modelopt.recipe.load_recipe``) with ``model``, ``data``,
  ``training`` and ``eagle`` sections. ``training.answer_only_loss`` defaults to false, and then
  ``OfflineSupervisedDataset`` replaces the stored ``loss_mask`` with all ones
  (``modelopt/torch/speculative/eagle/utils.py``, ``__getitem__``); the aux layers an offline
  draft is built for (and exported with, for serving) are
  ``eagle.eagle_architecture_config.eagle_aux_hidden_state_layer_ids``, ModelOpt's own default
  when empty (``default_eagle_aux_layer_ids``).
- NeMo Automodel (``nemo-automodel`` 0.7.0): its ``train_eagle3`` recipe YAML (``recipe:
  TrainEagle3Recipe``) reads the cache at ``recipe_args.cached_target_path`` and refuses one whose
  ``mask_generation_prompt`` / ``mask_reasoning_content`` differ from its own settings
  (``ensure_supervision_options_match``); its aux layers are ``recipe_args.aux_layer_ids``, its
  default ``[1, L//2-1, L-4]`` when unset (``default_eagle3_aux_layer_ids``).

The snippets are YAML written by hand (values as JSON, which YAML reads as they are), so writing
one needs no YAML library."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...files import write_text

#: the snippet ``hidden-states --for modelopt`` writes: a whole recipe for ModelOpt's main.py
MODELOPT_RECIPE = "modelopt-eagle3.yaml"
#: the snippet ``hidden-states --for nemo-automodel`` writes: the train_eagle3 recipe's keys
NEMO_RECIPE = "nemo-automodel-eagle3.yaml"
#: the snippet ``export --as modelopt`` writes beside the ids
MODELOPT_EXPORT_SETTINGS = "draftdata-modelopt-settings.yaml"


@dataclass(frozen=True)
class Setting:
    """One key of a trainer's YAML config (dotted), its value, and why it must be so."""

    key: str
    value: Any
    why: str

    def line(self) -> str:
        return f"{self.key}: {json.dumps(self.value)}  ({self.why})"


def modelopt_aux_default(n_layers: int) -> list[int]:
    """ModelOpt 0.47.0's ``default_eagle_aux_layer_ids`` (plugins/hf_eagle.py): 0-based decoder
    layers, used when ``eagle_aux_hidden_state_layer_ids`` is empty."""
    return sorted({1, max(0, n_layers // 2 - 1), max(0, n_layers - 4)})


def nemo_aux_default(n_layers: int) -> list[int]:
    """NeMo Automodel 0.7.0's ``default_eagle3_aux_layer_ids`` (speculative/eagle/target.py):
    0-based decoder layers, used when ``recipe_args.aux_layer_ids`` is unset."""
    return [1, n_layers // 2 - 1, n_layers - 4]


def answer_only_loss() -> Setting:
    return Setting(
        "training.answer_only_loss",
        True,
        "its default, false, replaces our loss_mask with all ones: every prompt token trained",
    )


#: ModelOpt's training_seq_len default (TrainingArguments), which its export's YaRN settings match
MODELOPT_SEQ_LEN = 2048


def train_len(longest: int) -> Setting:
    return Setting(
        "training.training_seq_len",
        max(longest, MODELOPT_SEQ_LEN),
        f"its collator cuts every sample at this length; the longest sample has {longest} "
        f"tokens (ModelOpt's default, {MODELOPT_SEQ_LEN}, where every sample fits)",
    )


def modelopt_settings(out: Path, model: str, aux0: list[int], longest: int) -> list[Setting]:
    """ModelOpt's main.py over ``hidden-states --for modelopt`` files in ``out``."""
    return [
        Setting("model.model_name_or_path", model, "the target the states were captured from"),
        Setting(
            "data.offline_data_path",
            str(out.resolve()),
            "main.py trains on every *.pt under it (rglob)",
        ),
        answer_only_loss(),
        train_len(longest),
        Setting(
            "eagle.eagle_architecture_config.eagle_aux_hidden_state_layer_ids",
            aux0,
            "the layers captured, 0-based decoder layers; the draft is built and exported for them",
        ),
    ]


def nemo_settings(
    out: Path, model: str, aux0: list[int], seq_length: int, mask_generation_prompt: bool
) -> list[Setting]:
    """NeMo Automodel's train_eagle3 recipe over the cache ``hidden-states --for nemo-automodel``
    wrote in ``out``."""
    return [
        Setting("recipe_args.target_model_name_or_path", model, "the target of the cache"),
        Setting(
            "recipe_args.cached_target_path",
            str(out.resolve()),
            "its offline path: the cache is read, the target never run",
        ),
        Setting(
            "recipe_args.mask_generation_prompt",
            mask_generation_prompt,
            "our masks leave out what the generation prompt supplies; NeMo refuses a cache "
            "built under another value",
        ),
        Setting(
            "recipe_args.mask_reasoning_content",
            False,
            "our masks train the reasoning the model wrote",
        ),
        Setting("recipe_args.seq_length", seq_length, "the cache's padded length"),
        Setting(
            "recipe_args.aux_layer_ids",
            aux0,
            "the layers captured, 0-based decoder layers; serve the draft with these",
        ),
    ]


def _nested(settings: list[Setting]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for s in settings:
        *parents, leaf = s.key.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = s
    return tree


def _yaml(tree: dict[str, Any], indent: int = 0) -> list[str]:
    lines = []
    pad = "  " * indent
    for k, v in tree.items():
        if isinstance(v, Setting):
            lines.append(f"{pad}{k}: {json.dumps(v.value)}  # {v.why}")
        elif isinstance(v, dict):
            lines.append(f"{pad}{k}:")
            lines.extend(_yaml(v, indent + 1))
        else:
            lines.append(f"{pad}{k}: {json.dumps(v)}")
    return lines


def write_snippet(
    path: Path, head: list[str], settings: list[Setting], fixed: dict[str, Any] | None = None
) -> Path:
    """``settings`` as a YAML file (``fixed``: keys written first, as they are), under ``head``
    as comments."""
    tree: dict[str, Any] = dict(fixed or {})
    for k, v in _nested(settings).items():
        if isinstance(tree.get(k), dict) and isinstance(v, dict):
            tree[k] = {**tree[k], **v}
        else:
            tree[k] = v
    text = "".join(f"# {h}\n" for h in head) + "\n".join(_yaml(tree)) + "\n"
    return write_text(path, text)


def write_modelopt_recipe(
    out: Path, model: str, aux0: list[int], longest: int
) -> tuple[Path, list[Setting]]:
    """``out/modelopt-eagle3.yaml``: a recipe ModelOpt's main.py loads as it is; its settings."""
    settings = modelopt_settings(out, model, aux0, longest)
    path = write_snippet(
        out / MODELOPT_RECIPE,
        [
            "ModelOpt (nvidia-modelopt 0.47.0) EAGLE-3 offline training on the files in this",
            "folder, written by draftdata hidden-states --for modelopt. Run from ModelOpt's",
            "examples/speculative_decoding: python main.py --config THIS_FILE [key=value ...]",
            "(add training.output_dir and what else your run needs; keep the keys below).",
        ],
        settings,
        {"metadata": {"recipe_type": "speculative_eagle"}},
    )
    return path, settings


def write_nemo_recipe(
    out: Path, model: str, aux0: list[int], seq_length: int, mask_generation_prompt: bool
) -> tuple[Path, list[Setting]]:
    """``out/nemo-automodel-eagle3.yaml``: the train_eagle3 recipe's keys for this cache; its
    settings."""
    settings = nemo_settings(out, model, aux0, seq_length, mask_generation_prompt)
    path = write_snippet(
        out / NEMO_RECIPE,
        [
            "NeMo Automodel (nemo-automodel 0.7.0) EAGLE-3 offline training on the cache in",
            "this folder, written by draftdata hidden-states --for nemo-automodel. Merge these",
            "keys into your train_eagle3 recipe YAML (recipe: TrainEagle3Recipe).",
        ],
        settings,
        {"recipe": "TrainEagle3Recipe"},
    )
    return path, settings


def modelopt_export_settings(longest: int) -> list[Setting]:
    """The settings ``export --as modelopt`` can know (no capture yet: no layers, no states)."""
    return [
        answer_only_loss(),
        train_len(longest),
    ]


def write_modelopt_export_settings(folder: Path, longest: int) -> Path:
    """``folder/draftdata-modelopt-settings.yaml``: ``modelopt_export_settings`` as YAML."""
    return write_snippet(
        folder / MODELOPT_EXPORT_SETTINGS,
        [
            "ModelOpt (nvidia-modelopt 0.47.0) settings for draftdata's ids, written by",
            "draftdata export --as modelopt. These files hold ids and masks only: ModelOpt's",
            "offline trainer needs hidden states too. `draftdata hidden-states RUN --for modelopt`",
            "writes the files main.py trains on, with a whole recipe (modelopt-eagle3.yaml).",
        ],
        modelopt_export_settings(longest),
    )


def export_notes(kind: str, paths: list[str]) -> list[str]:
    """What ``export --as kind`` prints after its paths: the trainer's settings, read back from
    the snippet the export wrote (none for a trainer without a trap)."""
    if kind != "modelopt":
        return []
    snippet = Path(paths[0]) / MODELOPT_EXPORT_SETTINGS if paths else None
    if snippet is None or not snippet.is_file():
        return []
    return [
        "modelopt: ids and masks only, not training files by themselves (ModelOpt's offline "
        "trainer needs hidden states: `draftdata hidden-states RUN --for modelopt`)",
        f"modelopt: ModelOpt settings for these samples ({snippet}):",
        *(f"  {line}" for line in _snippet_lines(snippet)),
    ]


def _snippet_lines(path: Path) -> list[str]:
    """The ``key: value  # why`` lines of a snippet, keys dotted."""
    out: list[str] = []
    parents: list[str] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        depth = (len(raw) - len(raw.lstrip())) // 2
        key, _, rest = raw.strip().partition(":")
        parents = [*parents[:depth], key]
        value, _, why = rest.partition("  # ")
        if value.strip():
            out.append(f"{'.'.join(parents)}: {value.strip()}  ({why.strip()})")
    return out


#: what ``plan --hidden-for LAYOUT`` warns of before a run, per trainer
PLAN_WARNINGS = {
    "modelopt": (
        "ModelOpt trains on our loss masks only with training.answer_only_loss: true; its "
        "default (false) replaces them with all ones, silently. `draftdata hidden-states --for "
        "modelopt` writes the recipe with it (OUT/modelopt-eagle3.yaml)"
    ),
}


def plan_warning(layout: str | None) -> str | None:
    """The warning ``plan --hidden-for layout`` prints, where the trainer has a trap."""
    return PLAN_WARNINGS.get(layout or "")
