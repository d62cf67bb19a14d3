"""The built-in chat formats. Each renders exactly what its model's chat template renders, with
user, system, tool and model text kept as text. Differences from a template are deliberate and
listed in the class docstring."""

from __future__ import annotations

from .base import ChatFormat
from .deepseek import DEEPSEEK_R1, DEEPSEEK_V3, DEEPSEEK_V31, DeepSeekV3Format
from .kimi import KIMI_K2, KimiK2Format
from .qwen import QWEN3, QWEN3_THINKING, QWEN35, Qwen3Format
from .template import CHATML, LLAMA3, TemplateFormat, probe_default_system

__all__ = [
    "BUILTIN",
    "CHATML",
    "DEEPSEEK_R1",
    "DEEPSEEK_V3",
    "DEEPSEEK_V31",
    "KIMI_K2",
    "LLAMA3",
    "QWEN3",
    "QWEN3_THINKING",
    "QWEN35",
    "DeepSeekV3Format",
    "KimiK2Format",
    "Qwen3Format",
    "TemplateFormat",
    "probe_default_system",
]

BUILTIN: dict[str, ChatFormat] = {
    f.name: f
    for f in (
        CHATML,
        LLAMA3,
        QWEN3,
        QWEN3_THINKING,
        QWEN35,
        DEEPSEEK_V3,
        DEEPSEEK_V31,
        DEEPSEEK_R1,
        KIMI_K2,
    )
}
