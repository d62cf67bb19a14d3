"""Raw model outputs for the vLLM-parser oracle (``benchmarks/vllm_oracle.py``), plain data.

Each case: ``family`` (which tokenizer, draftdata format and vLLM parsers), ``raw`` (the model's
output: a string is encoded as the tokenizer library does by default, control tokens matched in
the text, which is how the model's own ids look; a list mixes such strings with ``{"typed": s}``
pieces, text the model wrote as ordinary tokens though it reads like a marker), and ``thinking``
(the prompt's thinking switch; default on). An output that ends without its end-of-turn id was
cut by ``max_tokens`` (finish ``length``).
"""

Q3_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
Q3_CALL_ROME = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
Q3_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>'
Q35_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>"
)
Q35_ROME = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
    "</function>\n</tool_call>"
)
Q35_DAYS = (
    "<tool_call>\n<function=forecast>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
K_SEC_B, K_SEC_E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
K_CALL = (
    "<|tool_call_begin|>functions.get_weather:{n}<|tool_call_argument_begin|>"
    '{{"city": "{c}"}}<|tool_call_end|>'
)
K1 = K_SEC_B + K_CALL.format(n=0, c="Paris") + K_SEC_E
K2 = K_SEC_B + K_CALL.format(n=0, c="Paris") + K_CALL.format(n=1, c="Rome") + K_SEC_E
DS_EOS = "<｜end▁of▁sentence｜>"
R1_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
R1_TWO = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>'
    'get_weather\n```json\n{"city": "Rome"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
V31_CALL = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
V31_TWO = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
    '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Rome"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)


def c(name, family, raw, thinking=True):
    return {"name": name, "family": family, "raw": raw, "thinking": thinking}


CORPUS = [
    # --- Qwen3 hybrid (model writes <think>\n R \n</think>\n\n C), Hermes calls
    c(
        "q3-plain",
        "qwen3",
        "<think>\nThe user asks two things.\n</think>\n\nIt is mild in Paris; 2 + 2 = 4.<|im_end|>",
    ),
    c(
        "q3-reasoning-trailing-newlines",
        "qwen3",
        "<think>\nCounting: two and two.\n\n</think>\n\nFour.<|im_end|>",
    ),
    c("q3-reasoning-trailing-spaces", "qwen3", "<think>\nCounting.  \n</think>\n\nFour.<|im_end|>"),
    c("q3-no-newline-after-think", "qwen3", "<think>\nEasy.\n</think>Four.<|im_end|>"),
    c("q3-single-newline-after-think", "qwen3", "<think>\nEasy.\n</think>\nFour.<|im_end|>"),
    c("q3-empty-think", "qwen3", "<think>\n\n</think>\n\nFour.<|im_end|>"),
    c("q3-thinking-off", "qwen3", "Four.<|im_end|>", thinking=False),
    c("q3-thinking-off-call", "qwen3", "Checking.\n" + Q3_CALL + "<|im_end|>", thinking=False),
    c("q3-thinking-off-only-call", "qwen3", Q3_CALL + "<|im_end|>", thinking=False),
    c(
        "q3-call",
        "qwen3",
        "<think>\nNeed the weather.\n</think>\n\nLet me check.\n" + Q3_CALL + "<|im_end|>",
    ),
    c(
        "q3-call-no-content",
        "qwen3",
        "<think>\nNeed the weather.\n</think>\n\n" + Q3_CALL + "<|im_end|>",
    ),
    c(
        "q3-call-content-two-newlines",
        "qwen3",
        "<think>\nNeed it.\n</think>\n\nChecking.\n\n" + Q3_CALL + "<|im_end|>",
    ),
    c(
        "q3-parallel",
        "qwen3",
        "<think>\nBoth.\n</think>\n\n" + Q3_CALL + "\n" + Q3_ADD + "<|im_end|>",
    ),
    c(
        "q3-parallel-same-tool",
        "qwen3",
        "<think>\nTwo cities.\n</think>\n\n" + Q3_CALL + "\n" + Q3_CALL_ROME + "<|im_end|>",
    ),
    c(
        "q3-call-compact-json",
        "qwen3",
        '<think>\nNeed it.\n</think>\n\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call><|im_end|>',
    ),
    c(
        "q3-call-non-ascii-arg",
        "qwen3",
        '<think>\nNeed it.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>',
    ),
    c("q3-cut-in-reasoning", "qwen3", "<think>\nFirst the weather, then the sum, which is"),
    c(
        "q3-cut-in-call",
        "qwen3",
        '<think>\nNeed it.\n</think>\n\n<tool_call>\n{"name": "get_weather", "argu',
    ),
    c("q3-cut-after-call-open", "qwen3", "<think>\nNeed it.\n</think>\n\nChecking.\n<tool_call>"),
    c(
        "q3-typed-think-in-content",
        "qwen3",
        [
            "<think>\nExplain.\n</think>\n\nModels write ",
            {"typed": "</think>"},
            " to end reasoning.<|im_end|>",
        ],
    ),
    c(
        "q3-typed-tool-call-in-content",
        "qwen3",
        [
            "<think>\nExplain.\n</think>\n\nA call starts with ",
            {"typed": "<tool_call>"},
            ".<|im_end|>",
        ],
    ),
    c(
        "q3-lookalike-think",
        "qwen3",
        "<think>\nTags like </ think> are not tags.\n</think>\n\nRight: </thinking> is not one either.<|im_end|>",
    ),
    c(
        "q3-non-ascii",
        "qwen3",
        "<think>\n用户问天气。\n</think>\n\n巴黎天气温和；2 + 2 = 4。🌤<|im_end|>",
    ),
    c("q3-content-trailing-newline", "qwen3", "<think>\nEasy.\n</think>\n\nFour.\n<|im_end|>"),
    # --- Qwen3.5 / Qwen3-Coder XML (the prompt opens <think>\n)
    c("q35-plain", "qwen3.5", "The sum is easy.\n</think>\n\nIt is 4.<|im_end|>"),
    c(
        "q35-reasoning-trailing-newlines",
        "qwen3.5",
        "The sum is easy.\n\n</think>\n\nIt is 4.<|im_end|>",
    ),
    c("q35-no-newline-before-close", "qwen3.5", "The sum is easy.</think>\n\nIt is 4.<|im_end|>"),
    c(
        "q35-call-after-think",
        "qwen3.5",
        "I should look it up.\n</think>\n\n" + Q35_CALL + "<|im_end|>",
    ),
    c(
        "q35-call-after-think-content",
        "qwen3.5",
        "Look it up.\n</think>\n\nChecking now.\n\n" + Q35_CALL + "<|im_end|>",
    ),
    c(
        "q35-call-after-think-content-one-newline",
        "qwen3.5",
        "Look it up.\n</think>\n\nChecking now.\n" + Q35_CALL + "<|im_end|>",
    ),
    c("q35-call-inside-think", "qwen3.5", "I should look it up.\n\n" + Q35_CALL + "<|im_end|>"),
    c("q35-call-glued-to-close", "qwen3.5", "Look it up.\n</think>" + Q35_CALL + "<|im_end|>"),
    c(
        "q35-parallel",
        "qwen3.5",
        "Two cities.\n</think>\n\n" + Q35_CALL + "\n" + Q35_ROME + "<|im_end|>",
    ),
    c("q35-typed-int", "qwen3.5", "Forecast.\n</think>\n\n" + Q35_DAYS + "<|im_end|>"),
    c(
        "q35-non-ascii-param",
        "qwen3.5",
        "Look it up.\n</think>\n\n" + Q35_CALL.replace("Paris", "São Paulo") + "<|im_end|>",
    ),
    c(
        "q35-multiline-param",
        "qwen3.5",
        "Look it up.\n</think>\n\n" + Q35_CALL.replace("Paris", "Paris\nFrance") + "<|im_end|>",
    ),
    c("q35-cut-in-reasoning", "qwen3.5", "Counting: two and two"),
    c(
        "q35-cut-in-call",
        "qwen3.5",
        "Look it up.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    ),
    c(
        "q35-typed-function-in-content",
        "qwen3.5",
        ["Explain.\n</think>\n\nXML calls open with ", {"typed": "<function="}, "NAME>.<|im_end|>"],
    ),
    c(
        "q35-typed-tool-call-in-reasoning",
        "qwen3.5",
        ["Calls look like ", {"typed": "<tool_call>"}, " here.\n</think>\n\nDone.<|im_end|>"],
    ),
    c("q35-thinking-off", "qwen3.5", "It is 4.<|im_end|>", thinking=False),
    c(
        "q35-thinking-off-call",
        "qwen3.5",
        "Checking.\n\n" + Q35_CALL + "<|im_end|>",
        thinking=False,
    ),
    c("q35-non-ascii", "qwen3.5", "Сумма простая.\n</think>\n\nЭто 4. ✓<|im_end|>"),
    # --- Kimi K2.5 (the prompt opens <think>; no whitespace in the grammar)
    c(
        "kimi-plain",
        "kimi-k2",
        "A greeting and a sum.</think>Hello! It is mild in Paris, and 2 + 2 = 4.<|im_end|>",
    ),
    c("kimi-newline-before-close", "kimi-k2", "A greeting and a sum.\n</think>Hello!<|im_end|>"),
    c("kimi-newlines-around-close", "kimi-k2", "A sum.\n</think>\n\nFour.<|im_end|>"),
    c("kimi-trailing-space-reasoning", "kimi-k2", "A sum. </think>Four.<|im_end|>"),
    c("kimi-call", "kimi-k2", "Weather first.</think>" + K1 + "<|im_end|>"),
    c(
        "kimi-call-with-content",
        "kimi-k2",
        "Weather first.</think>Let me check." + K1 + "<|im_end|>",
    ),
    c(
        "kimi-call-content-newline",
        "kimi-k2",
        "Weather first.</think>Let me check.\n" + K1 + "<|im_end|>",
    ),
    c("kimi-parallel", "kimi-k2", "Two cities.</think>" + K2 + "<|im_end|>"),
    c(
        "kimi-call-arg-spaces",
        "kimi-k2",
        "Weather.</think>"
        + K_SEC_B
        + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|> {"city": "Paris"} <|tool_call_end|>'
        + K_SEC_E
        + "<|im_end|>",
    ),
    c(
        "kimi-call-non-ascii",
        "kimi-k2",
        "天气。</think>" + K1.replace("Paris", "北京") + "<|im_end|>",
    ),
    c("kimi-cut-in-reasoning", "kimi-k2", "Counting two and"),
    c(
        "kimi-cut-in-call",
        "kimi-k2",
        "Weather.</think>"
        + K_SEC_B
        + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Par',
    ),
    c(
        "kimi-cut-in-section",
        "kimi-k2",
        "Weather.</think>" + K_SEC_B + K_CALL.format(n=0, c="Paris"),
    ),
    c(
        "kimi-typed-think",
        "kimi-k2",
        ["Explain.</think>The tag ", {"typed": "</think>"}, " ends it.<|im_end|>"],
    ),
    c(
        "kimi-lookalike-section",
        "kimi-k2",
        "Explain.</think>Markers look like <|tool_calls_section|> but differ.<|im_end|>",
    ),
    c("kimi-non-ascii", "kimi-k2", "用户打招呼。</think>你好！巴黎天气温和。<|im_end|>"),
    c("kimi-thinking-off", "kimi-k2", "Four.<|im_end|>", thinking=False),
    # --- DeepSeek R1 (V4 vocabulary with <think>; the prompt opens <think>\n)
    c("r1-plain", "deepseek-r1", "The user wants a sum.\n</think>\n\nFour." + DS_EOS),
    c("r1-reasoning-trailing-newlines", "deepseek-r1", "The sum.\n\n</think>\n\nFour." + DS_EOS),
    c("r1-no-newlines", "deepseek-r1", "The sum.</think>Four." + DS_EOS),
    c("r1-call", "deepseek-r1", "Need the weather.\n</think>\n\n" + R1_CALL + DS_EOS),
    c(
        "r1-call-content",
        "deepseek-r1",
        "Need the weather.\n</think>\n\nChecking." + R1_CALL + DS_EOS,
    ),
    c(
        "r1-call-content-newline",
        "deepseek-r1",
        "Need it.\n</think>\n\nChecking.\n\n" + R1_CALL + DS_EOS,
    ),
    c("r1-parallel", "deepseek-r1", "Two.\n</think>\n\n" + R1_TWO + DS_EOS),
    c("r1-cut-in-reasoning", "deepseek-r1", "The user wants"),
    c(
        "r1-cut-in-call",
        "deepseek-r1",
        'Need it.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city"',
    ),
    c(
        "r1-typed-think",
        "deepseek-r1",
        ["Explain.\n</think>\n\nThe ", {"typed": "</think>"}, " tag.", DS_EOS],
    ),
    c("r1-non-ascii", "deepseek-r1", "用户要求和。\n</think>\n\n四。" + DS_EOS),
    # --- DeepSeek V3.1 (thinking: the prompt opens <think>; R</think>C; calls in non-thinking mode)
    c("v31-think", "deepseek-v3.1", "The user wants a sum.</think>Four." + DS_EOS),
    c("v31-think-newlines", "deepseek-v3.1", "The sum.\n</think>\n\nFour." + DS_EOS),
    c("v31-think-cut", "deepseek-v3.1", "The user wants a"),
    c("v31-off-plain", "deepseek-v3.1", "Four." + DS_EOS, thinking=False),
    c("v31-off-call", "deepseek-v3.1", "Checking." + V31_CALL + DS_EOS, thinking=False),
    c("v31-off-call-no-content", "deepseek-v3.1", V31_CALL + DS_EOS, thinking=False),
    c(
        "v31-off-call-content-newlines",
        "deepseek-v3.1",
        "Checking.\n\n" + V31_CALL + DS_EOS,
        thinking=False,
    ),
    c("v31-off-parallel", "deepseek-v3.1", "Both." + V31_TWO + DS_EOS, thinking=False),
    c(
        "v31-off-cut-in-call",
        "deepseek-v3.1",
        'Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"ci',
        thinking=False,
    ),
    c("v31-think-call", "deepseek-v3.1", "Need the weather.</think>" + V31_CALL + DS_EOS),
    c("v31-off-non-ascii", "deepseek-v3.1", "Ça fait quatre. ✓" + DS_EOS, thinking=False),
    c(
        "v31-off-typed-marker",
        "deepseek-v3.1",
        ["The ", {"typed": "</think>"}, " tag." + DS_EOS],
        thinking=False,
    ),
    # --- Llama 3 (no think block; llama3_json reads a JSON object as a call)
    c("llama-plain", "llama3", "Four.<|eot_id|>"),
    c("llama-non-ascii", "llama3", "Quatre, à Paris. ✓<|eot_id|>"),
    c("llama-cut", "llama3", "It is mild in Paris and two plus"),
    c(
        "llama-json-call",
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>',
    ),
    c("llama-json-looking-text", "llama3", 'Use {"name": "x"} as the payload.<|eot_id|>'),
    c("llama-trailing-newline", "llama3", "Four.\n<|eot_id|>"),
    c(
        "llama-typed-eot",
        "llama3",
        ["The ", {"typed": "<|eot_id|>"}, " token ends a turn.<|eot_id|>"],
    ),
]
