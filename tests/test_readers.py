"""Source readers on the real prompt files in their native formats, and on records written in
the documented formats of the datasets that no registry carries (Glaive, Magicoder, UltraChat,
Parquet / save_to_disk folders)."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import GROUNDTRUTH, PROMPTS
from draftdata.errors import InputError
from draftdata.records import Message, ToolCall
from draftdata.sources import READERS, read_prompts
from draftdata.sources.native import BFCL_TYPES

BFCL = ["simple_python", "multiple", "parallel", "parallel_multiple"]


@cache
def real(name: str, reader: str) -> tuple[list, Counter]:
    return read_prompts(PROMPTS / name, reader, name.split(".")[0])


@cache
def groundtruth(source: str) -> list[list[dict]]:
    out = []
    for line in GROUNDTRUTH.read_text().splitlines():
        r = json.loads(line)
        if r["source"] == source:
            out.append(r["messages"])
    return out


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def roles(p) -> list[str]:
    return [m.role for m in p.messages]


# --- real files ----------------------------------------------------------------------------------

REAL_COUNTS = [
    ("mt_bench_question.jsonl", "mtbench", 80, {}),
    ("fastchat_dummy_conversation.json", "sharegpt", 500, {}),
    (
        "sharegpt_v3_first1000.json",
        "sharegpt",
        976,
        {"no_conversations": 7, "no_user_turn": 12, "empty_turn": 4, "duplicate": 1},
    ),
    ("HumanEval.jsonl.gz", "humaneval", 164, {}),
    ("BFCL_v4_simple_python.json", "bfcl", 400, {}),
    ("BFCL_v4_multiple.json", "bfcl", 200, {}),
    ("BFCL_v4_parallel.json", "bfcl", 200, {}),
    ("BFCL_v4_parallel_multiple.json", "bfcl", 200, {}),
    ("writingbench_200.jsonl", "writingbench", 200, {}),
]


@pytest.mark.parametrize(("name", "reader", "n", "drops"), REAL_COUNTS)
def test_real_file_counts(name, reader, n, drops):
    prompts, counter = real(name, reader)
    assert (len(prompts), dict(counter)) == (n, drops)
    assert len({p.id for p in prompts}) == n
    assert all(p.dataset == name.split(".")[0] for p in prompts)
    assert all(any(m.role == "user" for m in p.messages) for p in prompts)
    assert all(
        isinstance(m.content, str) and m.content.strip()
        for p in prompts
        for m in p.messages
        if not m.tool_calls
    )


def test_every_real_file_is_covered():
    assert {name for name, *_ in REAL_COUNTS} == {
        p.name for p in PROMPTS.iterdir() if p.name != "README.md"
    }


def test_mtbench_both_turns_and_groundtruth_first_turns():
    prompts, _ = real("mt_bench_question.jsonl", "mtbench")
    assert all(roles(p) == ["user", "user"] for p in prompts)
    assert prompts[0].metadata == {"question_id": 81, "category": "writing"}
    firsts = [p.messages[0].content for p in prompts]
    for msgs in groundtruth("mtbench"):
        assert msgs[0]["content"] in firsts


def test_sharegpt_fastchat():
    prompts, _ = real("fastchat_dummy_conversation.json", "sharegpt")
    p = prompts[0]
    assert p.metadata == {"id": "identity_0"}
    assert p.messages == (
        Message("user", "Who are you?"),
        Message(
            "assistant",
            "I am Vicuna, a language model trained by researchers from Large Model Systems "
            "Organization (LMSYS).",
        ),
        Message("user", "Have a nice day!"),
        Message("assistant", "You too!"),
    )
    assert all(roles(p)[::2] == ["user"] * len(roles(p)[::2]) for p in prompts)


def test_sharegpt_v3_whole_conversations_and_groundtruth():
    prompts, _ = real("sharegpt_v3_first1000.json", "sharegpt")
    raw = {r["id"]: r for r in json.loads((PROMPTS / "sharegpt_v3_first1000.json").read_text())}
    p = prompts[0]
    assert p.metadata == {"id": "QWJhYvA_0"}
    conv = raw["QWJhYvA_0"]["conversations"]
    assert [m.content for m in p.messages] == [t["value"] for t in conv]
    assert roles(p) == [{"human": "user", "gpt": "assistant"}[t["from"]] for t in conv]
    # split conversations that start with the model's turn are kept whole, in order
    assert Counter(p.messages[0].role for p in prompts) == {"user": 603, "assistant": 373}
    # the ground truth's sharegpt prompts are first human turns of `_0` conversations
    firsts = {p.messages[0].content for p in prompts if p.metadata["id"].endswith("_0")}
    gt = groundtruth("sharegpt")
    assert gt and all(m[0]["content"] in firsts for m in gt)


def test_humaneval_matches_groundtruth_wording(tmp_path):
    prompts, _ = real("HumanEval.jsonl.gz", "humaneval")
    assert prompts[0].metadata == {"task_id": "HumanEval/0", "entry_point": "has_close_elements"}
    assert [p.metadata["task_id"] for p in prompts] == [f"HumanEval/{i}" for i in range(164)]
    gt = groundtruth("humaneval")
    by_text = {p.messages[0].content for p in prompts}
    assert gt and all(m == [{"role": "user", "content": m[0]["content"]}] for m in gt)
    assert all(m[0]["content"] in by_text for m in gt)
    # a different instruction (or none) from the manifest's columns
    bare, _ = read_prompts(PROMPTS / "HumanEval.jsonl.gz", "humaneval", "he", {"instruction": ""})
    assert bare[0].messages[0].content.startswith("from typing import List\n")


def _bfcl_all():
    out = []
    for cat in BFCL:
        out += real(f"BFCL_v4_{cat}.json", "bfcl")[0]
    return out


def _schema_types(node, out):
    """Every type name in a schema position (not a property that happens to be named type)."""
    if isinstance(node, dict):
        t = node.get("type")
        out += t if isinstance(t, list) else [t] if t is not None else []
        for v in (node.get("properties") or {}).values():
            _schema_types(v, out)
        items = node.get("items")
        for v in items if isinstance(items, list) else [items]:
            _schema_types(v, out)
    return out


def test_bfcl_tools_are_openai_json_schema():
    prompts = _bfcl_all()
    types = Counter()
    for p in prompts:
        assert roles(p) == ["user"] and p.tools
        assert p.metadata["category"] == p.metadata["id"].rsplit("_", 1)[0]
        for t in p.tools:
            assert t["type"] == "function" and set(t) == {"type", "function"}
            assert t["function"]["parameters"]["type"] == "object"
            types.update(_schema_types(t["function"]["parameters"], []))
    assert not set(types) & set(BFCL_TYPES), types
    assert {"object", "number", "array", "string", "integer", "boolean"} <= set(types)
    cats = Counter(p.metadata["category"] for p in prompts)
    assert cats == {
        "simple_python": 400,
        "multiple": 200,
        "parallel": 200,
        "parallel_multiple": 200,
    }


def test_bfcl_nested_and_named_type_properties():
    by_id = {p.metadata["id"]: p for p in _bfcl_all()}
    params = by_id["simple_python_260"].tools[0]["function"]["parameters"]
    assert params["properties"]["area"] == {
        "type": "object",
        "properties": {
            "width": {
                "type": "integer",
                "description": "The width of the area to be painted in feet.",
            },
            "height": {
                "type": "integer",
                "description": "The height of the area to be painted in feet.",
            },
        },
        "description": "The area to be painted.",
    }
    excl = params["properties"]["exclusion"]
    assert excl["type"] == "object"
    # a property *named* "type" keeps its schema: it is not a type name
    assert excl["properties"]["type"] == {
        "type": "string",
        "description": "The type of the exclusion e.g window, door etc.",
    }
    coord = by_id["simple_python_83"].tools[0]["function"]["parameters"]["properties"]["coord1"]
    assert coord == {
        "type": "array",
        "description": "The first coordinate as (latitude, longitude).",
        "items": {"type": "number"},
    }
    data = by_id["simple_python_109"].tools[0]["function"]["parameters"]["properties"]["data"]
    assert data["type"] == "string"
    assert by_id["multiple_0"].messages == (
        Message(
            "user",
            "Can I find the dimensions and properties of a triangle, if I know its three sides "
            "are 5 units, 4 units and 3 units long?",
        ),
    )
    assert [t["function"]["name"] for t in by_id["multiple_0"].tools][:2] == [
        "triangle_properties.get",
        "circle_properties.get",
    ]


def test_bfcl_tools_equal_the_groundtruth_conversion():
    """The ground truth rendered each item's converted tools as JSON in its system message."""
    by_question: dict[str, list[str]] = {}
    for p in _bfcl_all():
        by_question.setdefault(p.messages[0].content, []).append(
            json.dumps(list(p.tools), ensure_ascii=False)
        )
    gt = groundtruth("bfcl")
    head = "You can call these functions: "
    for msgs in gt:
        system, user = msgs[0]["content"], msgs[1]["content"]
        assert system.startswith(head)
        assert system[len(head) : system.index("\n\nTo call")] in by_question[user]
    assert len(gt) == 151


def test_bfcl_multi_turn_and_malformed(tmp_path):
    f = write_jsonl(
        tmp_path / "bfcl.json",
        [
            {
                "id": "multi_turn_base_0",
                "question": [
                    [{"role": "user", "content": "List the files."}],
                    [],
                    [{"role": "user", "content": "Now delete a.txt."}],
                ],
                "function": [{"name": "ls", "description": "List", "parameters": {"type": "dict"}}],
            },
            {"id": "x_1", "question": [[{"role": "user", "content": "Hi"}]]},  # no functions
            {
                "id": "x_2",
                "question": [[{"role": "robot", "content": "Hi"}]],
                "function": [{"name": "f"}],
            },
            {
                "id": "x_3",
                "question": [[{"role": "user", "content": ""}]],
                "function": [{"name": "f"}],
            },
            {
                "id": "x_4",
                "question": [[{"role": "user", "content": "Hi"}]],
                "function": [{"x": 1}],
            },
            {"id": "x_5", "question": [], "function": [{"name": "f"}]},
        ],
    )
    prompts, counter = read_prompts(f, "bfcl", "b")
    assert [m.content for m in prompts[0].messages] == ["List the files.", "Now delete a.txt."]
    assert prompts[0].tools[0]["function"]["parameters"] == {"type": "object"}
    assert prompts[0].metadata == {"id": "multi_turn_base_0", "category": "multi_turn_base"}
    assert dict(counter) == {
        "no_functions": 1,
        "bad_question": 1,
        "empty_turn": 1,
        "bad_functions": 1,
        "no_question": 1,
    }


def test_writingbench_queries_and_groundtruth():
    prompts, _ = real("writingbench_200.jsonl", "writingbench")
    assert prompts[0].metadata == {
        "index": 1,
        "domain1": "Academic & Engineering",
        "domain2": "Paper Outline",
    }
    assert prompts[0].messages[0].content.startswith("我想撰写一篇机器学习")
    assert all(roles(p) == ["user"] for p in prompts)
    queries = {p.messages[0].content for p in prompts}
    gt = {m[0]["content"] for m in groundtruth("writingbench")}
    # the ground truth drew from the whole benchmark: those within this file's 200 match verbatim
    assert (len(gt), len(gt & queries)) == (25, 18)


# --- ShareGPT records with tools -----------------------------------------------------------------


def test_sharegpt_function_calls_system_and_tools(tmp_path):
    weather = {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    f = tmp_path / "sg.json"
    f.write_text(
        json.dumps(
            [
                {
                    "id": "t1",
                    "system": "Be brief.",
                    "tools": json.dumps([weather]),  # LLaMA-Factory stores tools as JSON text
                    "conversations": [
                        {"from": "human", "value": "Weather in Paris and Rome?"},
                        {
                            "from": "function_call",
                            "value": json.dumps(
                                [
                                    {"name": "get_weather", "arguments": {"city": "Paris"}},
                                    {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                                ]
                            ),
                        },
                        {"from": "observation", "value": '{"temp": 21}'},
                        {"from": "tool", "value": '{"temp": 25}'},
                        {"from": "chatgpt", "value": "Paris 21, Rome 25."},
                        {"from": "user", "value": "Thanks"},
                        {"from": "bard", "value": "Welcome."},
                    ],
                },
                {
                    "conversations": [
                        {"from": "system", "value": "Own system."},
                        {"from": "human", "value": "Hé"},
                        {
                            "from": "function_call",
                            "value": '{"name": "f", "arguments": {"q": "é"}}',
                        },
                        {"from": "bing", "value": "Done."},
                    ],
                    "system": "ignored: the conversation has its own",
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                },
            ]
        )
    )
    (p, q), counter = read_prompts(f, "sharegpt", "sg")
    assert not counter
    assert p.metadata == {"id": "t1"}
    assert p.tools == ({"type": "function", "function": weather},)
    assert p.messages == (
        Message("system", "Be brief."),
        Message("user", "Weather in Paris and Rome?"),
        Message(
            "assistant",
            None,
            tool_calls=(
                ToolCall("get_weather", '{"city": "Paris"}', id="call_0"),
                ToolCall("get_weather", '{"city":"Rome"}', id="call_1"),  # verbatim text
            ),
        ),
        Message("tool", '{"temp": 21}', tool_call_id="call_0", name="get_weather"),
        Message("tool", '{"temp": 25}', tool_call_id="call_1", name="get_weather"),
        Message("assistant", "Paris 21, Rome 25."),
        Message("user", "Thanks"),
        Message("assistant", "Welcome."),
    )
    assert roles(q) == ["system", "user", "assistant", "assistant"]
    assert q.messages[0].content == "Own system."
    assert q.messages[2].tool_calls == (ToolCall("f", '{"q": "é"}', id="call_0"),)
    assert q.tools == ({"type": "function", "function": {"name": "f"}},)
    assert q.metadata == {}


def test_sharegpt_malformed_records_are_counted(tmp_path):
    ok = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    f = write_jsonl(
        tmp_path / "sg.jsonl",
        [
            ok,
            ok,  # duplicate content
            {"conversations": [{"from": "human", "value": "hi"}], "id": "other-id"},
            "{not json",
            "[1, 2]",
            {"conversations": []},
            {"conversations": [{"from": "gpt", "value": "only the model"}]},
            {"conversations": [{"from": "human", "value": "  "}]},
            {"conversations": [{"from": "human", "value": 3}]},
            {"conversations": [{"from": "robot", "value": "beep"}]},
            {
                "conversations": [
                    {"from": "human", "value": "q"},
                    {"from": "function_call", "value": "{"},
                ]
            },
            {
                "conversations": [
                    {"from": "human", "value": "q"},
                    {"from": "function_call", "value": '{"name": "f", "arguments": "not json"}'},
                ]
            },
            {"conversations": [{"from": "human", "value": "q"}], "tools": "{broken"},
            {"conversations": [{"from": "human", "value": "q"}], "tools": [{"no_name": 1}]},
        ],
    )
    prompts, counter = read_prompts(f, "sharegpt", "sg")
    assert len(prompts) == 2
    assert dict(counter) == {
        "duplicate": 1,
        "malformed_json": 1,
        "not_an_object": 1,
        "no_conversations": 1,
        "no_user_turn": 1,
        "empty_turn": 1,
        "bad_turn": 1,
        "unknown_role": 1,
        "bad_function_call": 2,
        "bad_tools": 2,
    }


# --- Glaive function-calling v2 ------------------------------------------------------------------

EXCHANGE = {
    "name": "get_exchange_rate",
    "description": "Get the exchange rate between two currencies",
    "parameters": {
        "type": "object",
        "properties": {
            "base_currency": {"type": "string", "description": "The currency to convert from"},
            "target_currency": {"type": "string", "description": "The currency to convert to"},
        },
        "required": ["base_currency", "target_currency"],
    },
}
PROSE = "You are a helpful assistant with access to the following functions. Use them if required -"


def glaive_system(*fns: dict) -> str:
    return f"SYSTEM: {PROSE}\n" + "\n\n".join(json.dumps(f, indent=4) for f in fns) + "\n"


def test_glaive_calls_responses_and_tools(tmp_path):
    calc = {
        "name": "calculate_tip",
        "description": "Calculate the tip amount",
        "parameters": {
            "type": "object",
            "properties": {
                "bill_amount": {"type": "number", "description": "The total bill"},
                "tip_percentage": {"type": "number", "description": "The tip percentage"},
            },
            "required": ["bill_amount", "tip_percentage"],
        },
    }
    records = [
        {
            "system": glaive_system(EXCHANGE),
            "chat": "USER: Can you book a flight for me from New York to London?\n\n\n"
            "ASSISTANT: I'm sorry, but I don't have the capability to book flights. My current "
            "function allows me to get the exchange rate between two currencies. <|endoftext|>\n\n\n",
        },
        {
            "system": glaive_system(EXCHANGE),
            "chat": "USER: What's the exchange rate from USD to EUR?\n\n\n"
            'ASSISTANT: <functioncall> {"name": "get_exchange_rate", "arguments": '
            '\'{"base_currency": "USD", "target_currency": "EUR"}\'} <|endoftext|>\n\n\n'
            'FUNCTION RESPONSE: {"exchange_rate": 0.85}\n\n\n'
            "ASSISTANT: The current exchange rate from USD to EUR is 0.85. <|endoftext|>\n\n\n",
        },
        {
            "system": "SYSTEM: You are a helpful assistant, with no access to external functions.",
            "chat": "USER: Tell me a joke.\n\n\nASSISTANT: Why did the chicken cross the road? "
            "<|endoftext|>\n\n\nUSER: Why?\n\n\nASSISTANT: To get to the other side. <|endoftext|>\n",
        },
        {
            "system": glaive_system(EXCHANGE, calc),
            "chat": "USER: My bill is $50 and I tip 20%. Also the Rock's fee?\n\n\n"
            "ASSISTANT: Let me work that out. <functioncall> "
            '{"name": "calculate_tip", "arguments": {"bill_amount": 50, "tip_percentage": 20}} '
            "<|endoftext|>\n\n\n"
            'FUNCTION RESPONSE: {"tip_amount": 10}\n\n\n'
            'ASSISTANT: <functioncall> {"name": "get_exchange_rate", "arguments": '
            '\'{"base_currency": "The Rock\'s", "target_currency": "EUR"}\'} <|endoftext|>\n\n\n'
            'FUNCTION RESPONSE: {"error": "unknown currency"}\n\n\n'
            "ASSISTANT: Your tip is $10. <|endoftext|>\n\n\n",
        },
    ]
    prompts, counter = read_prompts(write_jsonl(tmp_path / "g.jsonl", records), "glaive", "g")
    assert not counter and len(prompts) == 4
    tool = {"type": "function", "function": EXCHANGE}
    refuse, call, plain, two = prompts
    assert refuse.tools == (tool,)
    assert refuse.messages == (
        Message("system", PROSE),
        Message("user", "Can you book a flight for me from New York to London?"),
        Message(
            "assistant",
            "I'm sorry, but I don't have the capability to book flights. My current function "
            "allows me to get the exchange rate between two currencies.",
        ),
    )
    assert call.tools == (tool,)
    assert call.messages == (
        Message("system", PROSE),
        Message("user", "What's the exchange rate from USD to EUR?"),
        Message(
            "assistant",
            None,
            tool_calls=(
                ToolCall(
                    "get_exchange_rate",
                    '{"base_currency": "USD", "target_currency": "EUR"}',
                    id="call_0",
                ),
            ),
        ),
        Message("tool", '{"exchange_rate": 0.85}', tool_call_id="call_0", name="get_exchange_rate"),
        Message("assistant", "The current exchange rate from USD to EUR is 0.85."),
    )
    assert plain.tools == ()
    assert plain.messages == (
        Message("system", "You are a helpful assistant, with no access to external functions."),
        Message("user", "Tell me a joke."),
        Message("assistant", "Why did the chicken cross the road?"),
        Message("user", "Why?"),
        Message("assistant", "To get to the other side."),
    )
    assert two.tools == (tool, {"type": "function", "function": calc})
    assert roles(two) == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert two.messages[2] == Message(
        "assistant",
        "Let me work that out.",
        tool_calls=(
            ToolCall("calculate_tip", '{"bill_amount": 50, "tip_percentage": 20}', id="call_0"),
        ),
    )
    assert two.messages[3].tool_call_id == "call_0"
    assert two.messages[4].tool_calls == (
        ToolCall(
            "get_exchange_rate",
            '{"base_currency": "The Rock\'s", "target_currency": "EUR"}',
            id="call_1",
        ),
    )
    assert (two.messages[5].tool_call_id, two.messages[5].name) == ("call_1", "get_exchange_rate")
    assert all("<|endoftext|>" not in (m.content or "") for p in prompts for m in p.messages)


def test_glaive_malformed_records_are_counted(tmp_path):
    good_chat = "USER: hi\n\n\nASSISTANT: hello <|endoftext|>\n"
    records = [
        {"system": 'SYSTEM: x -\n{"name": "f", ', "chat": good_chat},  # truncated schema
        {"system": glaive_system(EXCHANGE) + "and some prose", "chat": good_chat},
        {"system": 'SYSTEM: x -\n{"description": "no name"}', "chat": good_chat},
        {"system": "", "chat": ""},
        {"system": "", "chat": "hello there\nUSER: hi"},
        {"system": "", "chat": "ASSISTANT: I speak first and alone. <|endoftext|>"},
        {"system": "", "chat": "USER: \n\n\nASSISTANT: hm"},
        {
            "system": "",
            "chat": 'USER: q\n\n\nASSISTANT: <functioncall> {"name": "f", "arguments": \'{bad\'}',
        },
        {"system": "", "chat": "USER: q\n\n\nASSISTANT: <functioncall> not json at all"},
        {"system": "", "chat": good_chat},
    ]
    prompts, counter = read_prompts(write_jsonl(tmp_path / "g.jsonl", records), "glaive", "g")
    assert [p.messages for p in prompts] == [(Message("user", "hi"), Message("assistant", "hello"))]
    assert dict(counter) == {
        "bad_system": 3,
        "no_chat": 1,
        "bad_chat": 1,
        "no_user_turn": 1,
        "empty_turn": 1,
        "bad_function_call": 2,
    }


# --- Magicoder and UltraChat ---------------------------------------------------------------------


def test_magicoder_oss_and_evol(tmp_path):
    oss = write_jsonl(
        tmp_path / "oss.jsonl",
        [
            {
                "lang": "python",
                "raw_index": 7,
                "index": 0,
                "seed": "def add(a, b):\n    return a + b\n",
                "problem": "You are tasked with implementing a Stack class in Python.",
                "solution": "class Stack: ...",
            },
            {"lang": "rust", "problem": "", "solution": "fn main() {}"},
        ],
    )
    prompts, counter = read_prompts(oss, "magicoder-oss", "oss")
    assert len(prompts) == 1 and dict(counter) == {"no_problem": 1}
    assert prompts[0].messages == (
        Message("user", "You are tasked with implementing a Stack class in Python."),
    )
    assert prompts[0].metadata == {"lang": "python", "index": 0}
    evol = write_jsonl(
        tmp_path / "evol.jsonl",
        [
            {"instruction": "Write a SQL query that lists duplicate emails.", "response": "SELECT"},
            {"response": "orphan"},
        ],
    )
    prompts, counter = read_prompts(evol, "magicoder-evol", "evol")
    assert [p.messages for p in prompts] == [
        (Message("user", "Write a SQL query that lists duplicate emails."),)
    ]
    assert dict(counter) == {"no_instruction": 1}


def test_ultrachat_both_shapes(tmp_path):
    f = write_jsonl(
        tmp_path / "uc.jsonl",
        [
            {"id": "0", "data": ["How do bees fly?", "With wings.", "And birds?", "Also wings."]},
            {
                "prompt": "Name a prime.",
                "prompt_id": "abc123",
                "messages": [
                    {"role": "user", "content": "Name a prime."},
                    {"role": "assistant", "content": "7"},
                    {"role": "user", "content": "Another?"},
                ],
            },
            {"prompt": "Only a prompt.", "prompt_id": "p2"},
            {"id": "1", "data": []},
            {"id": "2", "data": ["q", ""]},
            {"id": "3"},
            {"prompt_id": "x", "messages": [{"role": "assistant", "content": "a"}]},
            {"prompt_id": "y", "messages": [{"role": "narrator", "content": "a"}]},
        ],
    )
    prompts, counter = read_prompts(f, "ultrachat", "uc")
    a, b, c = prompts
    assert a.metadata == {"id": "0"}
    assert a.messages == (
        Message("user", "How do bees fly?"),
        Message("assistant", "With wings."),
        Message("user", "And birds?"),
        Message("assistant", "Also wings."),
    )
    assert b.metadata == {"prompt_id": "abc123"}
    assert b.messages == (
        Message("user", "Name a prime."),
        Message("assistant", "7"),
        Message("user", "Another?"),
    )
    assert c.messages == (Message("user", "Only a prompt."),)
    assert dict(counter) == {"no_data": 2, "empty_turn": 1, "no_user_turn": 1, "bad_message": 1}


# --- Parquet and save_to_disk folders ------------------------------------------------------------

CHAT = [
    {"role": "system", "content": "Be exact."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "content": "-3C", "tool_call_id": "c1"},
    {"role": "assistant", "content": "It is -3C."},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def chat_table(n: int = 3) -> pa.Table:
    return pa.table(
        {
            "uid": [f"r{i}" for i in range(n)],
            "messages": [
                [*CHAT[:1], {**CHAT[1], "content": f"Weather in Oslo, day {i}?"}, *CHAT[2:]]
                for i in range(n)
            ],
            "tools": [[WEATHER_TOOL]] * n,
        }
    )


def test_parquet_messages_tools_and_row_groups(tmp_path):
    f = tmp_path / "chat.parquet"
    pq.write_table(chat_table(5), f, row_group_size=2)
    assert pq.ParquetFile(f).num_row_groups == 3
    prompts, counter = read_prompts(f, "parquet", "pq", {"id": "uid"})
    assert not counter and len(prompts) == 5
    p = prompts[1]
    assert p.metadata == {"id": "r1"}
    assert p.tools == (WEATHER_TOOL,)  # struct fields Arrow filled with nulls are dropped
    assert p.messages == (
        Message("system", "Be exact."),
        Message("user", "Weather in Oslo, day 1?"),
        Message(
            "assistant",
            None,
            tool_calls=(ToolCall("get_weather", '{"city": "Oslo"}', id="c1"),),
        ),
        Message("tool", "-3C", tool_call_id="c1"),
        Message("assistant", "It is -3C."),
    )


def test_parquet_prompt_column_with_system_tools_and_id(tmp_path):
    f = tmp_path / "p.parquet"
    pq.write_table(
        pa.table(
            {
                "question": ["What is 2+2?", "", "Capital of France?", "What is 2+2?"],
                "sys": ["Answer briefly.", None, "", "Answer briefly."],
                "fns": [
                    json.dumps([WEATHER_TOOL["function"]]),
                    None,
                    "{bad",
                    json.dumps([WEATHER_TOOL["function"]]),
                ],
                "qid": [10, 11, 12, 13],
            }
        ),
        f,
    )
    cols = {"prompt": "question", "system": "sys", "tools": "fns", "id": "qid"}
    prompts, counter = read_prompts(f, "parquet", "pq", cols)
    assert dict(counter) == {"empty_turn": 1, "bad_tools": 1, "duplicate": 1}
    [p] = prompts
    assert p.messages == (Message("system", "Answer briefly."), Message("user", "What is 2+2?"))
    assert p.tools == (WEATHER_TOOL,)
    assert p.metadata == {"id": 10}


def test_parquet_folder_and_duplicates_across_files(tmp_path):
    (tmp_path / "data").mkdir()
    pq.write_table(chat_table(3), tmp_path / "data" / "train-00000-of-00002.parquet")
    pq.write_table(chat_table(4), tmp_path / "data" / "train-00001-of-00002.parquet")
    prompts, counter = read_prompts(tmp_path, "parquet", "pq")
    assert len(prompts) == 4 and dict(counter) == {"duplicate": 3}
    assert [p.messages[1].content for p in prompts] == [
        f"Weather in Oslo, day {i}?" for i in range(4)
    ]
    assert all(p.metadata == {} for p in prompts)  # no `id` column, none mapped
    assert read_prompts(tmp_path, "parquet", "pq", limit=2)[0] == prompts[:2]


def save_to_disk(folder: Path, tables: list[pa.Table]) -> Path:
    """The layout `datasets.Dataset.save_to_disk` writes: Arrow *stream* files, state.json and
    dataset_info.json."""
    folder.mkdir(parents=True)
    names = []
    for i, t in enumerate(tables):
        name = f"data-{i:05d}-of-{len(tables):05d}.arrow"
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
            for b in t.to_batches(max_chunksize=2):
                w.write_batch(b)
        names.append({"filename": name})
    (folder / "state.json").write_text(
        json.dumps({"_data_files": names, "_fingerprint": "0", "_split": "train"})
    )
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return folder


def test_save_to_disk_folder(tmp_path):
    d = save_to_disk(tmp_path / "ds", [chat_table(3), chat_table(5).slice(3)])
    prompts, counter = read_prompts(d, "parquet", "sd", {"id": "uid"})
    assert not counter
    assert [p.metadata["id"] for p in prompts] == ["r0", "r1", "r2", "r3", "r4"]
    assert prompts[4].messages[2].tool_calls[0].arguments == '{"city": "Oslo"}'
    # a single Arrow file, in the random-access file format too
    f = tmp_path / "one.arrow"
    with pa.OSFile(str(f), "wb") as sink, pa.ipc.new_file(sink, chat_table(2).schema) as w:
        w.write_table(chat_table(2))
    assert len(read_prompts(f, "parquet", "a")[0]) == 2
    # a DatasetDict folder names its splits
    dd = tmp_path / "dd"
    save_to_disk(dd / "train", [chat_table(1)])
    (dd / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(InputError, match=r"DatasetDict.*dd/train"):
        read_prompts(dd, "parquet", "x")


def test_parquet_columns_errors_name_the_fix(tmp_path):
    f = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["hi"], "label": [1]}), f)
    with pytest.raises(InputError, match=r"available columns: text, label.*columns = \{ messages"):
        read_prompts(f, "parquet", "x")
    with pytest.raises(InputError, match=r"'body' \(columns.prompt\) not found.*text, label"):
        read_prompts(f, "parquet", "x", {"prompt": "body"})
    with pytest.raises(InputError, match="unknown key"):
        read_prompts(f, "parquet", "x", {"promt": "text"})
    assert read_prompts(f, "parquet", "x", {"prompt": "text"})[0][0].messages == (
        Message("user", "hi"),
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"no \.parquet or \.arrow files"):
        read_prompts(tmp_path / "empty", "parquet", "x")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(InputError, match="cannot read"):
        read_prompts(bad, "parquet", "x")


@pytest.mark.parametrize("name", sorted(READERS))
def test_missing_file_raises_input_error(tmp_path, name):
    with pytest.raises(InputError, match=r"missing\.jsonl.*(?i:no such file)"):
        read_prompts(tmp_path / "missing.jsonl", name, "x")


def test_duplicates_across_a_dataset_are_dropped_and_counted(tmp_path):
    rec = {"index": 1, "domain1": "a", "domain2": "b", "query": "Write a haiku."}
    f = write_jsonl(tmp_path / "wb.jsonl", [rec, {**rec, "index": 2}, {**rec, "query": "Other"}])
    prompts, counter = read_prompts(f, "writingbench", "wb")
    assert [p.messages[0].content for p in prompts] == ["Write a haiku.", "Other"]
    assert dict(counter) == {"duplicate": 1}
    # the id is the content hash: same conversation, same id, whatever the dataset name
    assert read_prompts(f, "writingbench", "other")[0][0].id == prompts[0].id


def test_every_name_the_manifest_accepts_has_a_reader_and_no_other_is_registered():
    """The manifest checks reader names against ``config.READER_NAMES`` (config imports no
    stage); ``sources`` registers one reader under each of those names and refuses any other."""
    from draftdata.config import READER_NAMES
    from draftdata.sources import reader

    assert set(READERS) == READER_NAMES
    with pytest.raises(LookupError, match="READER_NAMES"):
        reader("not-a-reader")
