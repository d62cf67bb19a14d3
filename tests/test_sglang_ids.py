"""SGLang returns the model's ids too, under its own names (issue 26: the profile's request asks
``return_token_ids`` first). SGLang 0.5.23's ``ChatCompletionResponseChoice`` carries them as
``response_token_ids`` and the prompt's as the choice's ``prompt_token_ids``
(``sglang/srt/entrypoints/openai/serving_chat.py``, ``_build_chat_response``); vLLM names them
``token_ids`` and a top-level ``prompt_token_ids``. Before, draftdata read only vLLM's names, so
an SGLang answer asked with ids was rebuilt from its text (and labelled lossy where SGLang's
parsers strip). The response below has SGLang's field names as its protocol writes them; the
expected ids are the tokenizer library's own encoding of the raw output."""

from __future__ import annotations

import json

from draftdata.records import Message
from draftdata.records.wire import detect_server, parse_answer, raw_ids
from draftdata.tokens.reconstruct import Item
from draftdata.tokens.target import Target

USER = (Message("user", "What is the weather in Paris?"),)


def _sglang_body(ids: list[int], prompt: list[int], content: str) -> str:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "tool_calls": None,
                                "reasoning_content": "Need the weather."},
                    "finish_reason": "stop",
                    "matched_stop": 151645,
                    "prompt_token_ids": prompt,
                    "response_token_ids": ids,
                }
            ],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "total_tokens": len(prompt) + len(ids)},
        }
    )  # fmt: skip


def test_sglangs_answer_ids_are_read_and_used_as_the_models(bound):
    b = bound("qwen3")
    raw = "<think>\nNeed the weather.\n</think>\n\nLet me check.<|im_end|>"
    truth = b.tokenizer.encode_as_stock(raw)
    prompt = Target(b).with_options(thinking=True).prompt_ids(USER)
    body = _sglang_body(truth, prompt, "Let me check.")
    got = parse_answer(body, want_ids=True)
    assert not isinstance(got, str)
    assert got.output_ids == tuple(truth)
    assert got.prompt_ids == tuple(prompt)
    assert got.view.server == "sglang"
    assert raw_ids(json.loads(body)) == (tuple(truth), tuple(prompt))
    (s,) = Target(b, thinking=True).reconstruct_many([Item(USER, got.view, output_ids=got.output_ids, server_prompt_ids=got.prompt_ids)])  # fmt: skip
    assert list(s.response_ids) == truth
    assert not [w for w in s.warnings if w.startswith("lossy:")]


def test_ids_not_asked_for_are_not_read(bound):
    body = _sglang_body([1, 2, 3], [4, 5], "x")
    got = parse_answer(body, want_ids=False)
    assert not isinstance(got, str) and got.output_ids is None and got.prompt_ids is None
    assert detect_server({"choices": [{"response_token_ids": [1]}]}) == "sglang"
