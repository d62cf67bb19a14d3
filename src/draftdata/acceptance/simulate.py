"""Acceptance simulated from the data itself, teacher-forced, in process: over answers of the
target's own greedy decoding, what an EAGLE-3 drafter would have drafted at every step the
engine takes, scored against the target's next tokens.

One forward of the target over an answer (its prompt, the answer, and K more greedy tokens past
its end, which the engine's last step also verifies) gives the drafter's inputs at every
position. The drafter, run by speculators' own model class (``Eagle3DraftModel``, the trainer's
code, not vLLM's), drafts K tokens at every position at once: its test-time-training forward,
teacher-forced, attends at draft step s to the first pass at every earlier position and to its
own steps at this one, which is what the engine's drafter sees at decode time. Which drafts are
taken is then walked as the engine walks: the prompt's prefill gives the first answer token;
each step drafts K tokens after the last accepted position, accepts the longest run equal to
the target's tokens, and adds one token of the target's own. The steps, draft tokens and
accepted tokens by position are vLLM's ``spec_decode_*`` counts for the same answers.

On greedy answers of a float32 engine the two are the same up to the drafter's near-ties; the
measured difference is in BENCHMARKS.md. Sampled answers are walked too, but the engine then
accepts by its rejection sampler, not by equality: the simulation is the greedy bound."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AcceptanceError
from ..records.acceptance import SpecCounts


@dataclass(frozen=True)
class Drafts:
    """The drafter's K drafts (target ids) at every position of a sequence: ``at[s][j]`` is the
    token drafted at step s from position j, for position j + 2 + s."""

    at: list[list[int]]


def walk(
    seq: Sequence[int], prompt_len: int, answer_len: int, drafts: Drafts, k: int
) -> SpecCounts:
    """The engine's steps over one answer: ``seq`` is the prompt, the answer and at least K
    tokens of the target's own past its end; the counts its drafts would earn."""
    per_pos = [0] * k
    steps = accepted = 0
    generated = 1  # the prefill's token
    while generated < answer_len:
        anchor = prompt_len - 2 + generated
        n = 0
        while n < k and drafts.at[n][anchor] == seq[anchor + 2 + n]:
            n += 1
        steps += 1
        accepted += n
        for i in range(n):
            per_pos[i] += 1
        generated += n + 1
    return SpecCounts(steps, steps * k, accepted, tuple(per_pos))


class Drafter:
    """An EAGLE-3 drafter in speculators' format (``speculators_model_type: eagle3``), loaded by
    speculators' own model class beside the target it drafts for."""

    def __init__(self, path: Path, target_folder: Path, torch: Any) -> None:
        try:
            from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
        except ImportError as e:
            raise AcceptanceError(
                f"simulating acceptance needs speculators (its EAGLE-3 model class): pip install "
                f"--no-deps speculators==0.9.0 hs-connectors==0.9.0 ({e})"
            ) from e
        cfg_file = Path(path) / "config.json"
        if not cfg_file.is_file():
            raise AcceptanceError(f"{path}: no config.json; give the drafter's folder")
        try:
            config = Eagle3SpeculatorConfig.from_pretrained(str(path))
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise AcceptanceError(
                f"{path}: not an EAGLE-3 drafter in speculators' format ({e}); convert another "
                "format with `speculators convert`"
            ) from e
        config.transformer_layer_config._attn_implementation = "sdpa"
        # its verifier is the target given here, wherever it was trained
        config.speculators_config.verifier.name_or_path = str(target_folder)
        loaded = Eagle3DraftModel.from_pretrained(str(path), config=config)  # type: ignore[no-untyped-call]
        self.model = loaded.float().eval()
        self.torch = torch
        self.layers = list(self.model.config.eagle_aux_hidden_state_layer_ids)

    def drafts(self, aux: Any, ids: Sequence[int], k: int) -> Drafts:
        """Drafts at every position of ``ids`` from the target's aux states ``aux`` [S, 3H]."""
        torch = self.torch
        x = torch.tensor([list(ids[1:])], dtype=torch.long)
        h = aux[:-1].unsqueeze(0).float()
        doc = torch.zeros_like(x)
        with torch.no_grad():
            steps = self.model(hidden_states=h, input_ids=x, document_ids=doc, ttt_steps=k)
        d2t = self.model.d2t
        out = []
        for s in steps:
            idx = s[0]
            out.append(
                (idx + d2t[idx]).tolist() if d2t is not None and d2t.numel() else idx.tolist()
            )
        return Drafts(out)


def _greedy_tail(lm: Any, ids: list[int], k: int) -> tuple[list[int], Any]:
    """``ids`` with the target's K greedy tokens after them, and the target's hidden states over
    all of it (one forward, then K one-token steps on its cache)."""
    torch, model = lm.torch, lm.model
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=True)
        states = [h[0] for h in out.hidden_states]
        cache = out.past_key_values
        seq = list(ids)
        logits = out.logits[0, -1]
        for _ in range(k):
            t = int(torch.argmax(logits))
            seq.append(t)
            step = model(
                torch.tensor([[t]]),
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=True,
            )
            cache = step.past_key_values
            logits = step.logits[0, -1]
            states = [torch.cat([a, b[0]]) for a, b in zip(states, step.hidden_states, strict=True)]
    return seq, states


def simulate(
    lm: Any,
    drafter: Drafter,
    answers: Sequence[tuple[Sequence[int], Sequence[int]]],
    k: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[SpecCounts, dict[str, int]]:
    """The counts the engine would read for ``answers`` ((prompt ids, answer ids) each) drafted
    by ``drafter`` at K, and the answers left out (why -> count)."""
    total = SpecCounts(0, 0, 0, (0,) * k)
    left: Counter[str] = Counter()
    limit = lm.max_positions
    for i, (prompt, answer) in enumerate(answers, 1):
        if not prompt or not answer:
            left["no_token_ids" if not answer else "no_prompt_ids"] += 1
            continue
        ids = [*prompt, *answer]
        if limit is not None and len(ids) + k > limit:
            left["past_the_context"] += 1
            continue
        seq, states = _greedy_tail(lm, ids, k)
        aux = lm.torch.cat([states[layer] for layer in drafter.layers], dim=-1)
        total = total + walk(seq, len(prompt), len(answer), drafter.drafts(aux, seq, k), k)
        if progress is not None:
            progress(i, len(answers))
    return total, dict(left)
