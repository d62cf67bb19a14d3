"""Text that came from outside (a server's error, an answer, a URL on the command line) made
safe where a person reads it: no secret, and no raw control byte.

- ``redact``: a URL's ``user:password@`` and each credential query parameter (``redact_url``,
  found anywhere in the text), a ``Bearer`` token, an API key shaped as providers issue them
  (``sk-...``), and any secret the caller names (the key itself) become ``***``.
- ``visible``: control characters but tab and newline become their Unicode pictures
  (ESC is ``␛``, NUL ``␀``), C1 controls ``\\x9b``-style escapes: an escape sequence a server
  sends cannot set a terminal's title, clear its screen or conceal text, nor sit raw in a page.

Stored attempts keep a server's words verbatim but for secrets (``redact``); every line the
CLI prints goes through ``shown`` (``cli.app.say``), and every report page through
``visible``."""

from __future__ import annotations

import re
from collections.abc import Iterable

#: a URL anywhere in a text (up to a blank or a quote)
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>]+""")
#: an HTTP bearer token, or a header that carries a key
_BEARER = re.compile(
    r"(?i)\b(bearer|authorization:\s*bearer|x-api-key:|api-key:)(\s+)[A-Za-z0-9._~+/=-]+"
)
#: an API key as providers issue them: sk-..., sk-or-v1-..., sk-ant-... (OpenAI, OpenRouter,
#: Anthropic), at least 16 characters after the prefix
_KEY = re.compile(r"\b(sk|rk|pk)-[A-Za-z0-9_-]{16,}")
#: the shortest secret named by a caller that is looked for (shorter ones would hit words)
MIN_SECRET = 8

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def _picture(m: re.Match[str]) -> str:
    c = ord(m[0])
    if c < 0x20:
        return chr(0x2400 + c)
    if c == 0x7F:
        return "\u2421"
    return f"\\x{c:02x}"


def visible(text: str) -> str:
    """``text`` with every control character but tab and newline made visible."""
    return _CONTROL.sub(_picture, text)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with the secrets it may hold replaced by ``***`` (see the module's text)."""
    from .config.backends import redact_url  # the manifest's rules for URLs

    for s in secrets:
        if s and len(s) >= MIN_SECRET:
            text = text.replace(s, "***")
    text = _URL.sub(lambda m: redact_url(m[0]), text)
    text = _BEARER.sub(lambda m: f"{m[1]}{m[2]}***", text)
    return _KEY.sub(lambda m: f"{m[1]}-***", text)


def shown(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` as a terminal may show it: redacted, and its control characters visible."""
    return visible(redact(text, secrets))


__all__ = ["redact", "shown", "visible"]
