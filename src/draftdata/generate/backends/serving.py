"""What an OpenAI-compatible server says about itself, asked before any paid request: which engine
serves (``GET /v1/models``: vLLM and SGLang name themselves in ``owned_by``), the context it
serves (``max_model_len``), and how it renders a conversation into ids (vLLM's ``POST /tokenize``
with the messages, at the server's root). Free requests only: nothing here generates.

Every value is read with bounds (the server is not trusted): a body over ``MAX_BODY`` bytes, a
redirect, or a field of the wrong type is "the server did not say", never an exception."""

from __future__ import annotations

import http.client
import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...config import OpenAIBackendCfg

#: a server's self-description is small: a larger body is not read
MAX_BODY = 4 * 1024 * 1024
#: the most ids a context (or a rendered prompt) is taken to hold
MAX_LEN = 1 << 31
TIMEOUT_S = 10.0
#: the engines that serve a model's own ids and name themselves in /v1/models
ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class Served:
    """What ``/v1/models`` says of the model a backend asks for."""

    #: "vllm" or "sglang" where ``owned_by`` names one; None: another server (or it did not say)
    server: str | None
    #: the model id the server serves
    model: str
    #: the context the server serves, prompt and answer together; None: it did not say
    max_model_len: int | None


def http_request(
    url: str,
    method: str,
    headers: dict[str, str],
    body: bytes | None,
    timeout: float,
    max_body: int = MAX_BODY,
) -> tuple[int, bytes] | str:
    """(status, body) or why not: one request on a fresh connection, no redirect followed, the
    body read up to ``max_body``."""
    u = urlsplit(url)
    conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    try:
        conn = conn_cls(u.hostname or "", u.port, timeout=timeout)
    except (ValueError, http.client.HTTPException) as e:
        return f"cannot connect ({e})"
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    try:
        conn.request(
            method,
            path,
            body=body,
            headers={**headers, **({"Content-Type": "application/json"} if body else {})},
        )
        r = conn.getresponse()
        data = r.read(max_body + 1)
        if len(data) > max_body:
            return f"the answer is larger than {max_body} bytes"
        return r.status, data
    except (TimeoutError, OSError, http.client.HTTPException) as e:
        return f"no answer ({type(e).__name__}: {e})"
    finally:
        conn.close()


def auth_headers(cfg: OpenAIBackendCfg) -> dict[str, str]:
    """The bearer header of a backend whose key variable is set; none otherwise (a local server
    needs none). The backend itself refuses an unset variable before it sends anything."""
    key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def _json(got: tuple[int, bytes] | str) -> Any:
    if isinstance(got, str) or got[0] != 200:
        return None
    try:
        return json.loads(got[1])
    except (ValueError, RecursionError):
        return None


def _length(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < MAX_LEN else None


def root_of(base_url: str) -> str:
    """The server's root, where vLLM serves ``/tokenize``: the base URL without ``/v1``."""
    u = urlsplit(base_url)
    path = u.path.rstrip("/")
    path = path.removesuffix("/v1")
    return f"{u.scheme}://{u.netloc}{path}"


def served(
    base_url: str, headers: dict[str, str], model: str | None, timeout: float = TIMEOUT_S
) -> Served | None:
    """What ``GET {base_url}/models`` says of ``model`` (or of the only model served, where
    ``model`` is empty or None); None where the server says nothing usable."""
    doc = _json(http_request(base_url.rstrip("/") + "/models", "GET", headers, None, timeout))
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    cards = [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]
    pick = [c for c in cards if c["id"] == model] if model else []
    if not pick and len(cards) == 1:
        pick = cards
    if not pick:
        return None
    card = pick[0]
    owner = card.get("owned_by")
    server = owner if isinstance(owner, str) and owner in ENGINES else None
    return Served(server, card["id"], _length(card.get("max_model_len")))


def tokenize_chat(
    base_url: str, headers: dict[str, str], request: dict[str, Any], timeout: float = TIMEOUT_S
) -> list[int] | str:
    """The ids vLLM's own renderer makes of a chat request (``POST /tokenize`` with its
    messages, tools and ``chat_template_kwargs``, with the generation prompt), or why not."""
    body = json.dumps({**request, "add_generation_prompt": True}, ensure_ascii=False).encode()
    got = http_request(root_of(base_url) + "/tokenize", "POST", headers, body, timeout)
    if isinstance(got, str):
        return got
    if got[0] != 200:
        return f"HTTP {got[0]}: {error_text(got[1])}"
    doc = _json(got)
    tokens = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(tokens, list) or len(tokens) >= MAX_LEN:
        return "the answer holds no token list"
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < MAX_LEN for t in tokens):
        return "the answer's tokens are not all ids"
    return tokens


def error_text(body: bytes | str | None, limit: int = 300) -> str:
    """The server's own words for a refusal, where its body says them: OpenAI's
    ``{"error": {"message": ...}}``, vLLM's and SGLang's ``{"message": ...}`` or
    ``{"detail": ...}``; otherwise the body's start. At most ``limit`` characters, one line."""
    if body is None:
        return ""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    msg: Any = None
    try:
        doc = json.loads(text[: 1 << 20])
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            msg = err.get("message")
        elif isinstance(err, str):
            msg = err
        if not isinstance(msg, str):
            msg = doc.get("message", doc.get("detail"))
    if not isinstance(msg, str):
        msg = text
    line = " ".join(msg.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


__all__ = [
    "ENGINES",
    "Served",
    "auth_headers",
    "error_text",
    "http_request",
    "root_of",
    "served",
    "tokenize_chat",
]
