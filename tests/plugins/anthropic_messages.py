"""A backend kind for Anthropic's Messages API (``POST {base_url}/messages``), written as a
plugin: this one file plus one entry point (``[draftdata.backends] anthropic =
anthropic_messages``) is all it takes. Its answers are stored in Anthropic's own shape, and
``read_answer`` reads them back for the tokens stage and for a resumed run."""

import asyncio
import json
import time
import urllib.request
from typing import Literal

from pydantic import BaseModel

from draftdata.config.backends import BackendKind, register_backend
from draftdata.generate.backends.base import Backend
from draftdata.records import ApiView, Completion

#: Anthropic's stop reasons as draftdata's finish reasons
STOPS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}


class AnthropicCfg(BaseModel, extra="forbid"):  # the manifest's [backends.NAME] table
    kind: Literal["anthropic"]
    base_url: str
    model: str = "claude"


def read_answer(body):
    """An Anthropic message as the answer draftdata tokenizes; None for any other body."""
    if not isinstance(body, dict) or body.get("type") != "message":
        return None
    text = "".join(b["text"] for b in body.get("content", []) if b.get("type") == "text")
    return ApiView(text, STOPS.get(body.get("stop_reason"), "stop"))


class AnthropicBackend(Backend):
    def __init__(self, name, cfg, manifest, bound):  # what make_backend passes
        super().__init__(name)
        self.cfg = cfg

    def post(self, body):
        req = urllib.request.Request(
            self.cfg.base_url + "/messages",
            json.dumps(body).encode(),
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as f:
            return f.read().decode()

    async def run_batch(self, requests, on_failure):
        out = []
        for r in requests:
            body = {
                "model": self.cfg.model,
                "max_tokens": r.sampling.max_tokens,
                "messages": [{"role": m.role, "content": m.content} for m in r.messages],
            }
            intent = await self.before_send(r) if self.before_send is not None else None
            t0 = time.time()
            text = await asyncio.to_thread(self.post, body)
            resp = json.loads(text)
            view, usage = read_answer(resp), resp.get("usage", {})
            out.append(
                Completion(
                    request=body,
                    response=resp,
                    response_text=text,
                    finish_reason=view.finish_reason,
                    view=view,
                    prompt_tokens=usage.get("input_tokens"),
                    completion_tokens=usage.get("output_tokens"),
                    started_at=t0,
                    latency_s=time.time() - t0,
                    intent=intent,
                )
            )
        return out


register_backend(
    BackendKind(
        "anthropic",
        AnthropicCfg,
        f"{__name__}:AnthropicBackend",
        False,
        "Anthropic's Messages API (text answers)",
        reader=f"{__name__}:read_answer",
    )
)
