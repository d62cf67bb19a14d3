import time
from typing import Literal

from pydantic import BaseModel

from draftdata.config.backends import BackendKind, register_backend
from draftdata.generate.backends.base import Backend
from draftdata.generate.backends.engines import engine_completion


class EchoCfg(BaseModel, extra="forbid"):  # the manifest's [backends.NAME] table
    kind: Literal["echo"]
    text: str | None = None  # a fixed answer; unset: echo the last user message


class EchoBackend(Backend):  # answers with exact ids, so its datasets are ground truth
    def __init__(self, name, cfg, manifest, bound):  # what make_backend passes
        super().__init__(name)
        self.cfg, self.bound = cfg, bound

    async def run_batch(self, requests, on_failure):
        out = []
        for r in requests:  # the answer's ids: its text, then the format's end of turn
            text = self.cfg.text or [m for m in r.messages if m.role == "user"][-1].content
            ids = [*self.bound.tokenizer.encode(text), self.bound.end_id]
            out.append(engine_completion(self.bound, r, ids, "stop", "echo", time.time()))
        return out


register_backend(BackendKind("echo", EchoCfg, f"{__name__}:EchoBackend", True, "echoes"))
