"""The model's own chat template as an oracle, with sentinels so content never becomes control.

``oracle_ids`` renders the template through transformers (``render_jinja_template``, the function
behind ``apply_chat_template``) with every control-token string inside user-supplied content
replaced by a private-use sentinel. Control-token strings left in the rendered text therefore came
from the template itself and become their ids; all text between them is joined, the sentinels are
put back, and it is encoded as ordinary text. That is exactly "the template's ids with user text
kept as text", computed without any draftdata format code.
"""

from __future__ import annotations

import re
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template


def _mark(obj: Any, controls: list[str]) -> Any:
    if isinstance(obj, str):
        for i, c in enumerate(controls):
            obj = obj.replace(c, f"\ue010{i}\ue011")
        return obj
    if isinstance(obj, dict):
        return {k: _mark(v, controls) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_mark(v, controls) for v in obj]
    return obj


def _unmark(text: str, controls: list[str]) -> str:
    return re.sub("\ue010(\\d+)\ue011", lambda m: controls[int(m.group(1))], text)


def render(
    template: str,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]


def oracle_ids(
    tok,
    template: str,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> list[int]:
    controls = sorted(tok.control_by_text, key=len, reverse=True)
    text = render(
        template,
        _mark(messages, controls),
        _mark(tools, controls) if tools else None,
        add_generation_prompt,
        **kwargs,
    )
    pattern = "(" + "|".join(re.escape(c) for c in controls) + ")"
    ids: list[int] = []
    buf = ""
    for piece in re.split(pattern, text):
        if piece in tok.control_by_text:
            if buf:
                ids += tok.encode(_unmark(buf, controls))
            buf = ""
            ids.append(tok.control_by_text[piece].id)
        else:
            buf += piece
    if buf:
        ids += tok.encode(_unmark(buf, controls))
    return ids
