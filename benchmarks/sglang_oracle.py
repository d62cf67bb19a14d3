"""SGLang 0.5.23's own parsers as the oracle for draftdata's server views (issue 26, item 4).

The same corpus, tokenizers, comparison and tables as ``benchmarks/vllm_oracle.py`` (imported
from it), with SGLang's non-streaming chat path in place of vLLM's. SGLang's serving class
(``OpenAIServingChat``) does not import without the engine (its module pulls in the scheduler,
the model configs and torchvision), so this runs SGLang's own parsers and protocol objects,
called exactly as ``serving_chat.py`` calls them, with the few lines of glue between them
copied from there (line numbers of sglang 0.5.23):

- the request: SGLang's ``ChatCompletionRequest`` built as a client sends it (tools given,
  ``separate_reasoning`` default, ``chat_template_kwargs`` for the family's thinking switch);
  ``_process_messages`` (l. 1860) turns ``skip_special_tokens`` off whenever tools are given and
  ``tool_choice`` is not ``none``; SGLang's own ``to_sampling_params`` gives the flags
  (``spaces_between_special_tokens`` only from ``chat_template_kwargs``, l. 1206);
- the detokenizer: ``DetokenizerManager._decode_batch_token_id_output`` (managers/
  detokenizer_manager.py) re-stated for one request: the scheduler sends a non-streaming
  request's ids every ``SGLANG_FORCE_STREAM_INTERVAL`` (50) tokens and when it finishes, after
  the last 5 prompt ids (``init_incremental_detokenize``); surrogate and read windows decoded
  with ``batch_decode(skip_special_tokens, spaces_between_special_tokens)`` (fast tokenizers) or
  SGLang's ``decode_without_hf_kwargs`` (slow ones: Kimi's TikToken); ``trim_matched_stop`` drops
  the matched end-of-turn id (``{"type": "stop", "matched": id}``) before decoding, so it is never
  in the text; an answer cut by max_tokens finishes ``{"type": "length", ...}``;
- the response: ``_build_chat_response`` (l. 2832) and ``_process_tool_calls`` (l. 3150):
  ``ReasoningParser(model_type, stream_reasoning=False, force_reasoning=template's
  force_reasoning or _get_reasoning_from_request, request, tokenizer,
  tool_call_parser_active).parse_non_stream``, then ``FunctionCallParser(tools, parser,
  tokenizer, tool_choice, prefix, constrained).has_tool_call`` / ``parse_non_stream``, the ids of
  ``_process_tool_call_id`` (Kimi: ``functions.{name}:{history + tool_index}``), the finish
  reason rewritten to ``tool_calls`` (matched None) where calls were parsed, ``content=text if
  text else ""``, ``reasoning_content`` None when empty, and SGLang's own
  ``ChatCompletionResponse`` (``response_token_ids`` and ``prompt_token_ids`` on the choice when
  ``return_token_ids``), dumped to JSON. The template's reasoning toggle comes from SGLang's
  ``detect_reasoning_pattern`` on the family's chat template.

Only the sampling loop and the glue above are not SGLang's. Each response is read back by
draftdata and rebuilt under ``--server sglang`` and ``auto``, and the rebuilt ids are compared
id for id with the raw output's (``vllm_oracle.classify``).

Run it from the venv that holds vLLM and SGLang's parsers (``make install`` builds it)::

    .venv/vllm/bin/python benchmarks/sglang_oracle.py [--json OUT] [--only NAME_SUBSTR]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_oracle as vo

#: vllm_oracle's parser runs, by the SGLang parsers that serve the same model
#: (``ReasoningParser.DetectorMap`` / ``FunctionCallParser.ToolCallParserEnum`` names)
SG_PARSERS = {
    "qwen3": ("qwen3", "qwen"),  # Qwen2.5-style Hermes calls
    "qwen3.5": ("qwen3", "qwen3_coder"),
    "kimi-k2": ("kimi_k2", "kimi_k2"),
    "kimi-k2-added": ("kimi_k2", "kimi_k2"),
    "deepseek-r1": ("deepseek-r1", "deepseekv3"),
    "deepseek-v3.1": ("deepseek-v3", "deepseekv31"),
    "llama3": (None, "llama3"),
}
RUNS = {fam: [p for p in runs if p in SG_PARSERS] for fam, runs in vo.RUNS.items()}

VARIANTS = {
    # what draftdata sends an SGLang server: the sglang profile's lossless_request and
    # return_token_ids (generate/backends/openai_api.py)
    "ids": {"skip_special_tokens": False, "return_token_ids": True},
    # text-only views (ids not offered: a proxy in front, an SGLang without return_token_ids)
    "profile": {"skip_special_tokens": False},
    "default": {},  # SGLang's defaults (skip_special_tokens true, turned off by the tools)
}
VARIANT_TITLE = {
    "ids": "draftdata's request: skip_special_tokens false + return_token_ids",
    "profile": "text only: skip_special_tokens false",
    "default": "text only: SGLang defaults",
}
FORCE_STREAM_INTERVAL = 50  # envs.SGLANG_FORCE_STREAM_INTERVAL's default
INIT_INCREMENTAL_DETOKENIZATION_OFFSET = 5  # managers/schedule_batch.py


def _import_template_detection() -> Any:
    """``sglang.srt.parser.template_detection``: its ``muse_spark_hook`` import (used only by
    the server-args resolution, not by ``detect_reasoning_pattern``) pulls in the engine."""
    name = "sglang.srt.arg_groups.muse_spark_hook"
    if name not in sys.modules:
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
            stub.muse_spark_chat_template_default = lambda *a, **k: None  # type: ignore[attr-defined]
            sys.modules[name] = stub
    from sglang.srt.parser import template_detection

    return template_detection


def sglang_detokenize(
    tok: Any, prompt_ids: list[int], ids: list[int], finish: dict[str, Any], sp: dict[str, Any]
) -> str:
    """The text SGLang's detokenizer sends for a non-streaming request (see the docstring)."""
    from sglang.srt.utils.patch_tokenizer import decode_without_hf_kwargs
    from sglang.utils import find_printable_text

    skip, space = sp["skip_special_tokens"], sp["spaces_between_special_tokens"]
    no_stop_trim = sp["no_stop_trim"]

    def decode(id_lists: list[list[int]]) -> list[str]:  # _grouped_batch_decode
        out = []
        for x in id_lists:
            if not x:
                out.append("")
            elif getattr(tok, "is_fast", False):
                out.append(
                    tok.batch_decode(
                        [x], skip_special_tokens=skip, spaces_between_special_tokens=space
                    )[0]
                )
            else:
                out.append(decode_without_hf_kwargs(tok, x, skip))
        return out

    def trim(output: Any, reason: dict[str, Any] | None) -> Any:  # trim_matched_stop
        if not reason or reason.get("matched") is None:
            return output
        matched = reason["matched"]
        if isinstance(matched, str) and isinstance(output, str):
            pos = output.find(matched)
            if pos == -1:
                return output
            return output[: pos + len(matched)] if no_stop_trim else output[:pos]
        if isinstance(matched, int) and isinstance(output, list):
            return output if no_stop_trim else output[:-1]  # no tool closer for these parsers
        return output

    # init_incremental_detokenize: the last prompt ids as the surrogate context
    read_offset = len(prompt_ids)
    surr_start = max(read_offset - INIT_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
    surr_and_decode = list(prompt_ids[surr_start:]) + list(ids)
    # the scheduler's sends: every FORCE_STREAM_INTERVAL ids, and at the end (finished)
    sends = [n for n in range(1, len(ids)) if n % FORCE_STREAM_INTERVAL == 0] + [len(ids)]
    decoded_text, decode_ids = "", []
    s_surr, s_read, sent_offset = 0, read_offset - surr_start, 0
    sent_decode = 0
    pieces = []
    for n in sends:
        reason = finish if n == len(ids) else None
        upto = read_offset - surr_start + n
        decode_ids.extend(surr_and_decode[sent_decode:upto])
        sent_decode = upto
        read_ids = trim(decode_ids[s_surr:], reason)
        surr_ids = decode_ids[s_surr:s_read]
        surr_text, read_text = decode([surr_ids])[0], decode([read_ids])[0]
        new_text = read_text[len(surr_text) :]
        if reason is None:
            pending = sent_offset - len(decoded_text)
            if new_text and not new_text.endswith("�"):
                decoded_text += new_text
                s_surr, s_read = s_read, len(decode_ids)
                sent_offset = len(decoded_text)
                pieces.append(new_text[pending:] if pending else new_text)
            else:
                printable = find_printable_text(new_text)
                sent_offset = len(decoded_text) + len(printable)
                pieces.append(printable[pending:] if pending else printable)
            continue
        output_str = trim(decoded_text + new_text, reason)
        pieces.append(output_str[sent_offset:])
    return "".join(pieces)  # the tokenizer manager's state.append_text


def _reasoning_from_request(request: Any, config: Any, detector: Any) -> bool:
    """``OpenAIServingChat._get_reasoning_from_request`` (l. 3518) for these parsers."""
    kw = request.chat_template_kwargs
    if config is None:
        mode = detector.reasoning_default if detector is not None else None
        if mode is None:
            return False
        if mode == "always":
            return True
        if mode in ("thinking", "enable_thinking"):
            return not kw or kw.get(mode) is not False
        if mode in ("explicit_thinking", "explicit_enable_thinking"):
            return kw is not None and kw.get(mode.replace("explicit_", "")) is True
        return False
    if config.special_case == "always":
        return True
    if config.toggle_param is None or config.default_enabled is None:
        return False
    if config.default_enabled:
        return not kw or kw.get(config.toggle_param) is not False
    return kw is not None and kw.get(config.toggle_param) is True


def sglang_response(
    fam: Any, ids: list[int], prompt_ids: list[int], thinking: bool, variant: str
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """SGLang's chat-completion response JSON for an answer whose ids are ``ids``; also the
    detokenized text the parsers saw and the sampling flags in force."""
    from sglang.srt.entrypoints.openai.protocol import (
        ChatCompletionRequest,
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
        FunctionResponse,
        ToolCall,
        UsageInfo,
    )
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    reasoning_parser, tool_call_parser = SG_PARSERS[fam.name]
    tok = hf_tokenizer(fam)
    kwargs = (fam.kwargs_on if thinking else fam.kwargs_off) or None
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": vo.USER}],
        "tools": vo.TOOLS,
        "max_tokens": 8192,
        **VARIANTS[variant],
    }
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    request = ChatCompletionRequest.model_validate(body)
    # _process_messages: tools given and tool_choice not none -> skip_special_tokens off
    tools = list(request.tools or [])
    if tools and request.tool_choice != "none":
        request.skip_special_tokens = False
    sp = request.to_sampling_params(stop=request.stop or [], model_generation_config={})
    stop_ids = {tok.convert_tokens_to_ids(t) for t in fam.stop_texts}
    finished = bool(ids) and ids[-1] in stop_ids
    finish = (
        {"type": "stop", "matched": ids[-1]} if finished else {"type": "length", "length": len(ids)}
    )
    text = sglang_detokenize(tok, prompt_ids, ids, finish, sp)
    ret_item = {
        "text": text,
        "output_ids": list(ids),
        "meta_info": {"id": "r", "finish_reason": dict(finish)},
        "prompt_token_ids": list(prompt_ids) if request.return_token_ids else None,
    }
    # _build_chat_response
    finish_reason = ret_item["meta_info"]["finish_reason"]
    text = ret_item["text"]  # _decode_response
    reasoning_text, tool_calls = None, None
    tool_call_parsing_active = (
        bool(tool_call_parser) and bool(tools) and request.tool_choice != "none"
    )
    if reasoning_parser and request.separate_reasoning:
        td = _import_template_detection()
        force_tpl, config = td.detect_reasoning_pattern(vo.dd_bound(fam).tokenizer.chat_template)
        detector = ReasoningParser(
            model_type=reasoning_parser, stream_reasoning=True, tokenizer=tok
        ).detector  # OpenAIServingChat.__init__'s _reasoning_detector
        force_reasoning = force_tpl or _reasoning_from_request(request, config, detector)
        parser = ReasoningParser(
            model_type=reasoning_parser,
            stream_reasoning=False,
            force_reasoning=force_reasoning,
            request=request,
            tokenizer=tok,
            tool_call_parser_active=tool_call_parsing_active,
        )
        reasoning_text, text = parser.parse_non_stream(text)
    if tool_call_parsing_active:  # _process_tool_calls (tool_choice auto: not required)
        parser = FunctionCallParser(
            tools,
            tool_call_parser,
            tokenizer=tok,
            tool_choice=request.tool_choice,
            prefix=request._response_parser_prefix,
            constrained=False,
        )
        if parser.has_tool_call(text):
            try:
                text, call_info_list = parser.parse_non_stream(text)
                if call_info_list:
                    tool_calls = []
                    for index, call_info in enumerate(call_info_list):
                        if tool_call_parser == "kimi_k2":  # _process_tool_call_id
                            tool_id = f"functions.{call_info.name}:{0 + call_info.tool_index}"
                        else:
                            tool_id = f"call_{index:024x}"  # a uuid hex in SGLang
                        tool_calls.append(
                            ToolCall(
                                id=tool_id,
                                index=index,
                                function=FunctionResponse(
                                    name=call_info.name, arguments=call_info.parameters
                                ),
                            )
                        )
                    if finish_reason["type"] == "stop":
                        finish_reason["type"] = "tool_calls"
                        finish_reason["matched"] = None
            except Exception:  # SGLang logs it and keeps the text, no calls
                tool_calls = None
    choice = ChatCompletionResponseChoice(
        index=0,
        message=ChatMessage(
            role="assistant",
            content=text if text else "",
            tool_calls=tool_calls,
            reasoning_content=reasoning_text if reasoning_text else None,
        ),
        finish_reason=finish_reason["type"] if finish_reason else None,
        matched_stop=finish_reason.get("matched") if finish_reason else None,
        prompt_token_ids=(
            ret_item.get("prompt_token_ids")
            if request.return_prompt_token_ids or request.return_token_ids
            else None
        ),
        response_token_ids=ret_item["output_ids"] if request.return_token_ids else None,
    )
    resp = ChatCompletionResponse(
        id="r", created=0, model="m", choices=[choice],
        usage=UsageInfo(prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                        total_tokens=len(prompt_ids) + len(ids)),
    )  # fmt: skip
    flags = {
        "skip_special_tokens": sp["skip_special_tokens"],
        "spaces_between_special_tokens": sp["spaces_between_special_tokens"],
        "detokenizer": "batch_decode"
        if getattr(tok, "is_fast", False)
        else "decode_without_hf_kwargs",
    }
    return json.loads(resp.model_dump_json()), ret_item["text"], flags


_tok_cache: dict[str, Any] = {}


def hf_tokenizer(fam: Any) -> Any:
    """The family's plain transformers tokenizer (SGLang does not wrap it as vLLM does)."""
    if fam.hf not in _tok_cache:
        _tok_cache[fam.hf] = vo.load_hf_tokenizer(fam)
    return _tok_cache[fam.hf]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--only", help="run only cases whose name contains this")
    ap.add_argument("--show-views", action="store_true", help="print each SGLang view")
    a = ap.parse_args()
    import sglang

    t0 = time.time()
    rows = []
    for case, fname, fam, bound, thinking, truth, prompt_ids in vo.corpus_runs(RUNS, a.only):
        for variant in VARIANTS:
            try:
                resp, text, flags = sglang_response(fam, truth, prompt_ids, thinking, variant)
            except Exception as e:  # SGLang itself failed on this output
                rows.append({"case": case["name"], "parser": fname, "variant": variant,
                             "class": "sglang_error", "detail": repr(e)[:200]})  # fmt: skip
                continue
            ch = resp["choices"][0]
            msg = ch["message"]
            view = {
                "content": msg.get("content"),
                "reasoning_content": msg.get("reasoning_content"),
                "tool_calls": [(t["function"]["name"], t["function"]["arguments"], t["id"])
                               for t in msg.get("tool_calls") or []],
                "finish_reason": ch["finish_reason"],
                "matched_stop": ch.get("matched_stop"),
            }  # fmt: skip
            if a.show_views:
                print(case["name"], fname, variant, json.dumps(view, ensure_ascii=False))
            for server in ("sglang", "auto"):
                r = vo.classify(bound, truth, resp, server, thinking)
                rows.append({"case": case["name"], "parser": fname, "variant": variant,
                             "sglang_parsers": SG_PARSERS[fname], "server_mode": server,
                             "view": view, "text": text, "flags": flags,
                             # the id fields SGLang's own response object filled in
                             "id_fields": sorted(k for k, v in ch.items()
                                                 if k.endswith("token_ids") and v is not None),
                             **r})  # fmt: skip
    elapsed = time.time() - t0
    vo.report(
        rows, elapsed, sglang.__version__, len({r["case"] for r in rows}),
        engine="SGLang", titles=VARIANT_TITLE,
    )  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(rows, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
