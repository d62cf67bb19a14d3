"""Is anything listening at a backend's URL? A TCP connect and nothing more: a server that
counts requests sees none, and an unreachable base_url is named at once instead of after a
minute of refused retries."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

CONNECT_TIMEOUT_S = 3.0


def reachable(base_url: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when something accepts a TCP connection at the URL's host and port, else why not.
    Nothing is sent: a server that counts requests sees none."""
    u = urlparse(base_url)
    host = u.hostname or ""
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host}:{port} does not answer ({e.strerror or type(e).__name__})"
