"""A vLLM server's own counters, read from ``GET /metrics`` (Prometheus text): the spec-decode
counts (``vllm:spec_decode_num_drafts`` ... and per position), and what tells whether anyone
else uses the server (requests running or waiting, requests finished, tokens generated). The
counters are server-wide, so a measurement is the difference of two reads with nothing else
served in between."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from ..errors import AcceptanceError
from ..records.acceptance import SpecCounts

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
PREFIX = "vllm:spec_decode_"


@dataclass(frozen=True)
class Counters:
    """One read of the server's counters (summed over engines)."""

    spec: SpecCounts
    #: whether the server exports spec-decode counters at all (a server without a drafter
    #: exports none, or only zeros)
    speculating: bool
    running: int
    waiting: int
    finished: int
    generation_tokens: int
    prompt_tokens: int

    def busy(self) -> int:
        return self.running + self.waiting


def parse(text: str) -> Counters:
    """The counters of a ``/metrics`` page."""
    vals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    seen_spec = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, raw = m.group(1), m.group(2) or "", m.group(3)
        try:
            value = float(raw)
        except ValueError:
            continue
        if name.startswith(PREFIX):
            seen_spec = True
        if name == PREFIX + "num_accepted_tokens_per_pos_total":
            pos = dict(_LABEL.findall(labels)).get("position")
            if pos is not None and pos.isdigit():
                per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + value
            continue
        vals[name] = vals.get(name, 0.0) + value
    k = max(per_pos) + 1 if per_pos else 0
    spec = SpecCounts(
        int(vals.get(PREFIX + "num_drafts_total", 0)),
        int(vals.get(PREFIX + "num_draft_tokens_total", 0)),
        int(vals.get(PREFIX + "num_accepted_tokens_total", 0)),
        tuple(int(per_pos.get(i, 0)) for i in range(k)),
    )
    return Counters(
        spec,
        seen_spec,
        int(vals.get("vllm:num_requests_running", 0)),
        int(vals.get("vllm:num_requests_waiting", 0)),
        int(vals.get("vllm:request_success_total", 0)),
        int(vals.get("vllm:generation_tokens_total", 0)),
        int(vals.get("vllm:prompt_tokens_total", 0)),
    )


def root_of(base_url: str) -> str:
    """``http://host:port`` of a base URL that may end in ``/v1``."""
    return base_url.rstrip("/").removesuffix("/v1")


def read(base_url: str, timeout: float = 30.0) -> Counters:
    """``GET /metrics`` of the server at ``base_url``; one line naming the fix where it has none."""
    url = root_of(base_url) + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise AcceptanceError(
            f"{url}: HTTP {e.code}; acceptance is read from a vLLM server's Prometheus counters "
            "(start it without --disable-log-stats)"
        ) from e
    except (urllib.error.URLError, OSError) as e:
        raise AcceptanceError(
            f"{url}: no answer ({getattr(e, 'reason', e)}); check that the vLLM server is up"
        ) from e
    c = parse(text)
    if "vllm:" not in text:
        raise AcceptanceError(
            f"{url}: no vllm: counters on the page; acceptance is read from a vLLM server's "
            "own counters (point --server at vLLM)"
        )
    return c
