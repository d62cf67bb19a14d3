"""``hidden-states --for nemo-automodel``: NeMo Automodel's EAGLE-3 offline cache, the folder its
``train_eagle3`` recipe reads with ``recipe_args.cached_target_path`` (``CachedEagle3Dataset``,
``nemo_automodel/components/datasets/llm/eagle3_cache.py``, nemo-automodel 0.7.0), over our ids:

- ``manifest.json``: format 2, as ``precompute_eagle3`` writes it (``target_vocab_size``,
  ``draft_vocab_size``, ``selected_token_ids``, ``seq_length``, ``dtype``, ``num_samples``,
  ``shard_size``, ``target_probs_topk``, ``aux_hidden_dim``, ``aux_layer_ids``, the mask options),
  and a ``draftdata`` entry of our own (NeMo reads none of it);
- ``shard-{i:06d}.safetensors``: samples ``i*shard_size ...`` stacked along dim 0, each padded to
  ``seq_length`` (the longest sample): ``input_ids``, ``attention_mask``, ``loss_mask`` int64
  ``[n, S]``, ``aux_hidden_states`` ``[n, S, 3H]``, ``position_mask`` bool ``[n, S, 1]``, and the
  target's distribution over the draft vocabulary: ``target_probs`` ``[n, S, D]``, or with
  ``--top-k K`` its top K as ``target_probs_values`` ``[n, S, K]`` + ``target_probs_indices``
  int32 (renormalised to 1, as NeMo's ``compress_target_probs`` does); the samples' ids, first
  tokens and lengths in the file's metadata (NeMo reads tensors only);
- ``target_embeddings.safetensors``: the target's input embeddings (``weight``, float32).

What is shifted, as NeMo's own producer shifts it (``HFEagle3TargetModel.generate_batch``,
``_shift_left_with_zero``; ``precompute_eagle3._compute_batch_cache``): ``input_ids``,
``loss_mask`` and the distribution are our ids, our mask and the target's next-token
distribution moved one left (slot t holds token t+1, mask bit t+1, and the distribution of token
t+2), the last slot zero; ``aux_hidden_states`` and ``attention_mask`` are not shifted. So the
cache holds every id but the first (kept in the metadata). ``position_mask`` is NeMo's: the
shifted mask where the target's arg-max is in the draft vocabulary. The padding is the model's
pad id (its config's ``pad_token_id``, else ``eos_token_id``) under attention and mask 0, with
zero states and zero distributions (NeMo's producer runs the model over its pad tokens instead;
no mask bit reaches them).

The draft vocabulary is NeMo's own rule (``build_eagle3_token_mapping``): the special ids the
model's config names (bos, eos, pad, unk), then the ids our masks train, most frequent first, then
the lowest ids left; ``--draft-vocab`` unset keeps the whole target vocabulary (NeMo's default)."""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..export.trainers.settings import write_nemo_recipe
from ..files import write_json
from .codec import CorruptFileError
from .items import Item
from .layouts import Encoder, Job, _Files

if TYPE_CHECKING:
    from ..model.load import LoadedModel
    from .capture import Captured
    from .layers import Layers

__all__ = ["NemoCache", "select_draft_vocab"]

#: NeMo's cache format (eagle3_cache._FORMAT_VERSION) and its file names
FORMAT_VERSION = 2
NEMO_MANIFEST = "manifest.json"
EMBEDDINGS = "target_embeddings.safetensors"
#: top-k of the distribution kept by default (0: the whole draft vocabulary, NeMo's default)
TOP_K = 256
#: NeMo's precompute default shard size; shards are also kept to about SHARD_BYTES
SHARD_SIZE = 256
SHARD_BYTES = 1 << 30
#: positions whose distribution is computed at once (a float32 [ROWS, draft vocabulary] on the
#: model's device: 512 MiB at 128k ids)
ROWS = 1024
#: what our masks are, in NeMo's terms (its ChatDataset options, recorded in the manifest)
MASK_GENERATION_PROMPT = True
MASK_REASONING_CONTENT = False


def shard_name(i: int) -> str:
    return f"shard-{i:06d}.safetensors"


def select_draft_vocab(
    torch: Any, counts: Any, vocab: int, size: int | None, specials: list[int]
) -> list[int]:
    """NeMo's ``build_eagle3_token_mapping`` over ``counts`` (each id's trained count)."""
    if size is None or size >= vocab:
        return list(range(vocab))
    chosen: list[int] = []
    seen: set[int] = set()
    for t in specials:
        if 0 <= t < vocab and t not in seen:
            chosen.append(t)
            seen.add(t)
    for t in torch.argsort(counts, descending=True, stable=True).tolist():
        if len(chosen) >= size:
            break
        if t not in seen and int(counts[t]) > 0:
            chosen.append(t)
            seen.add(t)
    for t in range(vocab):
        if len(chosen) >= size:
            break
        if t not in seen:
            chosen.append(t)
            seen.add(t)
    return chosen[:size]


def _digest(ids: list[int], mask: list[bool]) -> str:
    return hashlib.sha256(array("q", ids).tobytes() + bytes(mask)).hexdigest()


def _config_ids(cfg: Any, *names: str) -> list[int]:
    out = []
    for n in names:
        v = getattr(cfg, n, None)
        v = v[0] if isinstance(v, (list, tuple)) and v else v
        if isinstance(v, int):
            out.append(v)
    return out


class NemoCache(_Files):
    name = "nemo-automodel"
    keep_logits = True

    def __init__(
        self,
        out: Path,
        torch: Any,
        enc: Encoder,
        *,
        draft_vocab: int | None = None,
        top_k: int = TOP_K,
        shard_size: int | None = None,
    ) -> None:
        if draft_vocab is not None and draft_vocab < 1:
            raise InputError(f"--draft-vocab {draft_vocab}: give at least 1 (unset: the whole)")
        if top_k < 0:
            raise InputError(f"--top-k {top_k}: give 0 (the whole distribution) or more")
        if shard_size is not None and shard_size < 1:
            raise InputError(f"--shard-size {shard_size}: give at least 1")
        self.out, self.torch, self.enc = out, torch, enc
        self.draft_vocab, self.top_k, self.shard_size = draft_vocab, top_k, shard_size
        self.dt = torch.float32 if enc.dtype == "fp32" else torch.bfloat16
        self._start_sums()
        self.kept: set[int] = set()
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.mass = [0.0, 0, 1.0]  # kept top-k mass: sum, positions, least

    def bind(
        self, model: str, layers: Layers, files: list[Path], lm: LoadedModel | None = None
    ) -> None:
        """The model and layers the pass captures with (before ``prepare``)."""
        if lm is None:
            raise InputError("NeMo Automodel's cache is written by the process that runs the model")
        if len(layers.aux) != 3:
            raise InputError(
                f"--layers: NeMo Automodel's EAGLE-3 takes exactly 3 aux layers, not "
                f"{len(layers.aux)} ({list(layers.aux)}); use --layers auto or i,j,k"
            )
        cfg = lm.model.config
        self.lm, self.model, self.layers, self.files = lm, model, layers, files
        self.vocab = int(lm.vocab_size)
        self.hidden = int(getattr(cfg, "hidden_size", 0) or 0)
        self.specials = _config_ids(cfg, "bos_token_id", "eos_token_id", "pad_token_id")
        self.specials += _config_ids(cfg, "unk_token_id")
        pads = _config_ids(cfg, "pad_token_id") or _config_ids(cfg, "eos_token_id") or [0]
        self.pad = pads[0]

    def prepare(self, items: Iterator[Item]) -> None:
        """One read of every sample: the padded length, the draft vocabulary from the trained
        ids, the shards' size; NeMo's manifest and the embeddings written; every shard an
        earlier run left whole and holding these samples kept."""
        torch = self.torch
        counts = torch.zeros(self.vocab, dtype=torch.long)
        self.digests: list[str] = []
        longest = 0
        for it in items:
            ids = torch.tensor(it.input_ids, dtype=torch.long)
            trained = ids[torch.tensor(it.loss_mask, dtype=torch.bool)]
            counts += torch.bincount(trained.clamp(0, self.vocab - 1), minlength=self.vocab)
            longest = max(longest, len(it.input_ids))
            self.digests.append(_digest(it.input_ids, it.loss_mask))
        if not self.digests:
            raise InputError("no samples to capture")
        self.seq = longest
        self.selected = select_draft_vocab(
            torch, counts, self.vocab, self.draft_vocab, self.specials
        )
        d = len(self.selected)
        self.k = self.top_k if 0 < self.top_k < d else 0
        per = self.seq * (3 * self.hidden * 2 + (self.k * 6 if self.k else d * 2) + 25)
        self.size = self.shard_size or max(1, min(SHARD_SIZE, SHARD_BYTES // max(per, 1)))
        self.nemo = self._nemo_manifest()
        self._keep_earlier()
        for p in self.out.glob("shard-*.safetensors"):  # an earlier run's beyond this one's
            if p.name not in {shard_name(s) for s in self._shards()}:
                p.unlink()
        write_json(self.out / NEMO_MANIFEST, {"format_version": FORMAT_VERSION, **self.nemo})
        weight = self.lm.model.get_input_embeddings().weight.detach().float().cpu().contiguous()
        self._save_tensors(EMBEDDINGS, {"weight": weight}, {})

    def _nemo_manifest(self) -> dict[str, Any]:
        aux0 = [i - 1 for i in self.layers.aux]
        return {
            "target_model": self.model,
            "target_vocab_size": self.vocab,
            "draft_vocab_size": len(self.selected),
            "seq_length": self.seq,
            "dtype": self.enc.dtype,
            "num_samples": len(self.digests),
            "shard_size": self.size,
            "target_probs_topk": self.k,
            "aux_hidden_dim": self.hidden * len(aux0),
            "aux_layer_ids": aux0,
            "selected_token_ids": self.selected,
            "input_data": ",".join(str(f) for f in self.files),
            "split": None,
            "shuffle_seed": None,
            "mask_reasoning_content": MASK_REASONING_CONTENT,
            "mask_generation_prompt": MASK_GENERATION_PROMPT,
            "draftdata": {
                "producer": "draftdata hidden-states --for nemo-automodel",
                "pad_token_id": self.pad,
                "special_token_ids": self.specials,
                "shifted": "input_ids, loss_mask, target_probs and position_mask one left "
                "(slot t: token t+1), the last slot 0; aux_hidden_states and attention_mask "
                "unshifted; each shard's metadata holds its samples' first ids",
            },
        }

    def _shards(self) -> range:
        return range((len(self.digests) + self.size - 1) // self.size)

    def _members(self, shard: int) -> range:
        return range(shard * self.size, min((shard + 1) * self.size, len(self.digests)))

    def _keep_earlier(self) -> None:
        """Keep each shard of an earlier run under the same manifest whose file is the recorded
        one and whose samples' digests are these samples'."""
        try:
            earlier = json.loads((self.out / NEMO_MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        earlier.pop("format_version", None)
        if earlier != self.nemo:
            return
        for s in self._shards():
            got = self._earlier(self.out / shard_name(s))
            if got is None:
                continue
            try:
                meta = json.loads(got[1].get("draftdata", "{}"))
            except ValueError:
                continue
            members = list(self._members(s))
            if meta.get("digests") == [self.digests[i] for i in members]:
                self.kept.update(members)

    def done(self, it: Item) -> bool:
        return it.index in self.kept

    def write(self, it: Item, cap: Captured) -> Job:
        """Sample ``it`` as NeMo's producer would cache it (computed on the model's device, kept
        on the host); the shard's write once its last sample is in."""
        torch = self.torch
        n, s = len(it.input_ids), self.seq
        dev = cap.logits.device
        ids = torch.tensor(it.input_ids + [self.pad] * (s - n), dtype=torch.long)
        mask = torch.tensor([int(b) for b in it.loss_mask] + [0] * (s - n), dtype=torch.long)
        zero = torch.zeros(1, dtype=torch.long)
        sample: dict[str, Any] = {
            "input_ids": torch.cat([ids[1:], zero]),
            "attention_mask": (torch.arange(s) < n).long(),
            "loss_mask": torch.cat([mask[1:], zero]),
        }
        aux = torch.zeros(s, 3 * self.hidden, dtype=self.dt)
        aux[:n] = cap.aux.reshape(n, -1).to(self.dt).cpu()
        sample["aux_hidden_states"] = aux
        if self.k:
            sample["target_probs_values"] = torch.zeros(s, self.k, dtype=self.dt)
            sample["target_probs_indices"] = torch.zeros(s, self.k, dtype=torch.int32)
        else:
            sample["target_probs"] = torch.zeros(s, len(self.selected), dtype=self.dt)
        pos = torch.zeros(s, 1, dtype=torch.bool)
        sel = torch.tensor(self.selected, dtype=torch.long, device=dev)
        in_draft = torch.zeros(self.vocab, dtype=torch.bool, device=dev)
        in_draft[sel] = True
        trained = mask[1:n].to(dev).bool()
        for a in range(0, n - 1, ROWS):  # slot t: the distribution of token t+2
            b = min(a + ROWS, n - 1)
            nxt = cap.logits[a + 1 : b + 1].float()
            pos[a:b, 0] = (in_draft[nxt.argmax(-1)] & trained[a:b]).cpu()
            probs = torch.softmax(nxt.index_select(-1, sel), dim=-1)
            if not self.k:
                sample["target_probs"][a:b] = probs.to(self.dt).cpu()
                continue
            values, idx = torch.topk(probs, self.k, dim=-1)
            kept = values.sum(-1)
            mass = kept[trained[a:b]]
            if mass.numel():
                self.mass[0] += float(mass.sum())
                self.mass[1] += mass.numel()
                self.mass[2] = min(self.mass[2], float(mass.min()))
            values = values / kept[:, None].clamp_min(torch.finfo(values.dtype).tiny)
            sample["target_probs_values"][a:b] = values.to(self.dt).cpu()
            sample["target_probs_indices"][a:b] = idx.to(torch.int32).cpu()
        sample["position_mask"] = pos
        sample["first"] = it.input_ids[0]
        sample["id"] = it.id
        sample["length"] = n
        shard = it.index // self.size
        got = self.pending.setdefault(shard, {})
        got[it.index] = sample
        if len(got) < len(self._members(shard)):
            return lambda: 0
        del self.pending[shard]
        return lambda: self._save_shard(shard, got)

    def _save_shard(self, shard: int, got: dict[int, dict[str, Any]]) -> int:
        members = list(self._members(shard))
        rows = [got[i] for i in members]
        keys = [k for k in rows[0] if k not in ("first", "id", "length")]
        tensors = {k: self.torch.stack([r[k] for r in rows]) for k in keys}
        meta = {
            "indices": members,
            "ids": [r["id"] for r in rows],
            "first": [r["first"] for r in rows],
            "lengths": [r["length"] for r in rows],
            "digests": [self.digests[i] for i in members],
        }
        return self._save_tensors(shard_name(shard), tensors, {"draftdata": json.dumps(meta)})

    def _save_tensors(self, name: str, tensors: dict[str, Any], meta: dict[str, str]) -> int:
        from safetensors.torch import save_file

        path = self.out / name
        return self._write(path, lambda t: save_file(tensors, str(t), metadata=meta or None))

    def close(self) -> dict[str, Any]:
        if self.pending:
            left = sorted(i for got in self.pending.values() for i in got)
            raise CorruptFileError(f"{self.out}: shards left unwritten (samples {left[:5]} ...)")
        aux0 = [i - 1 for i in self.layers.aux]
        recipe, settings = write_nemo_recipe(
            self.out, self.model, aux0, self.seq, MASK_GENERATION_PROMPT
        )
        names = [shard_name(s) for s in self._shards()] + [EMBEDDINGS]
        doc: dict[str, Any] = {
            "files": "shard-{i:06d}.safetensors",
            "recipe": recipe.name,
            "settings": [s.line() for s in settings],
            "sha256": {k: self.sums[k] for k in sorted(names) if k in self.sums},
            "nemo": {
                "manifest": NEMO_MANIFEST,
                "embeddings": EMBEDDINGS,
                "seq_length": self.seq,
                "shard_size": self.size,
                "draft_vocab_size": len(self.selected),
                "target_probs_topk": self.k,
                "pad_token_id": self.pad,
                "mask_generation_prompt": MASK_GENERATION_PROMPT,
                "mask_reasoning_content": MASK_REASONING_CONTENT,
            },
        }
        if self.k and self.mass[1]:
            doc["nemo"]["top_k_mass"] = {
                "mean": round(self.mass[0] / self.mass[1], 6),
                "least": round(self.mass[2], 6),
                "positions": self.mass[1],
            }
        return doc


def shard_samples(
    t: dict[str, Any], meta: dict[str, str], path: Path
) -> Iterator[tuple[int, str, list[int], dict[str, Any]]]:
    """``(index, id, ids, tensors)`` per sample of a cache shard's tensors and metadata: the ids
    unshifted (the first from the metadata), every tensor cut to the sample's slots (the shifted
    ones to its first n-1)."""
    try:
        m = json.loads(meta["draftdata"])
        rows = list(zip(m["indices"], m["ids"], m["first"], m["lengths"], strict=True))
    except (KeyError, ValueError, TypeError) as e:
        raise CorruptFileError(f"{path}: not a cache shard draftdata wrote ({e})") from e
    for r, (index, sid, first, n) in enumerate(rows):
        ids = [int(first), *t["input_ids"][r, : n - 1].tolist()]
        tensors = {"aux_hidden_states": t["aux_hidden_states"][r, :n]}
        for k in ("loss_mask", "position_mask", "target_probs", "target_probs_values"):
            if k in t:
                tensors[k] = t[k][r, : n - 1]
        yield int(index), str(sid), ids, tensors
