"""The manifest's ``[backends.NAME]`` tables, one pydantic model per backend kind, and
``BACKENDS``, the one table a new backend kind is added to (``register_backend`` adds one from
outside draftdata). Pure config: nothing here imports a backend's implementation
(``generate.backends.make_backend`` does, by the name the table holds)."""

from __future__ import annotations

import importlib
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args
from urllib.parse import unquote_plus, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..records.servers import check_server


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HFBackendCfg(_Strict):
    kind: Literal["hf"]
    model_path: str
    device: str = "cpu"
    batch_size: int = Field(8, ge=1, le=4096)


class OpenAIBackendCfg(_Strict):
    kind: Literal["openai"]
    base_url: str
    api_key_env: str | None = None
    #: the model name sent to this endpoint (default: target.model); "" sends none
    model: str | None = None
    concurrency: int = Field(16, ge=1, le=4096)
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(6, ge=0, le=100)
    #: the first retry's wait when the server names none (Retry-After); doubled on each retry
    backoff_s: float = Field(0.5, ge=0, le=60)
    rpm: float | None = Field(None, gt=0)
    tpm: float | None = Field(None, gt=0)
    price_in_per_mtok: float = Field(0.0, ge=0)
    price_out_per_mtok: float = Field(0.0, ge=0)
    extra_body: dict[str, Any] = {}
    token_ids: Literal["auto", "always", "never"] = "auto"
    #: an empty answer is asked again this many times, then kept (and dropped as empty)
    empty_retries: int = Field(2, ge=0, le=100)
    #: an answer body larger than this is stored, quarantined as oversized and not tokenized
    max_answer_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    #: answers streamed (``stream: true``) and read as they arrive, so one that runs far past
    #: max_tokens is hung up on at once: "auto" streams in a run with a budget (falling back to
    #: whole answers where the server refuses streams), "always" / "never" as they say
    stream: Literal["auto", "always", "never"] = "auto"
    #: the HTTP client: "auto" is the lean HTTP/1.1 client for http:// and aiohttp for https://
    http: Literal["auto", "lean", "aiohttp"] = "auto"
    #: what parses the answers (``records.servers``, whose table names them): its
    #: normalisations are undone or labelled ``lossy:*``; for vllm / sglang the request asks for
    #: the options that keep the text whole
    server: str = "auto"

    @field_validator("server")
    @classmethod
    def _server(cls, v: str) -> str:
        return check_server(v)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        problem = base_url_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v.rstrip("/")


class EngineBackendCfg(_Strict):
    """vLLM / SGLang offline engines (imported lazily where installed)."""

    kind: Literal["vllm", "sglang"]
    model_path: str
    batch_size: int = Field(256, ge=1)
    engine_args: dict[str, Any] = {}


_LIKE = "write it like http://127.0.0.1:8000/v1"


def base_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a backend's base URL, said with the fix, or None."""
    if not re.match(r"^https?://", url):
        return f"must start with http:// or https://; {_LIKE}"
    problem = url_problem(url)
    return None if problem is None else f"{problem}; {_LIKE}"


def url_problem(url: str) -> str | None:
    """What makes ``url`` (http or https) unusable as a base URL, or None: a host in brackets
    that is not an IPv6 address, no host, a port that is not 1-65535. The words never quote
    the URL: it may carry a password."""
    try:
        u = urlsplit(url)
    except ValueError:  # an unclosed "[", or an address in brackets that is not one
        return "the host in [brackets] is not an IPv6 address"
    host = u.netloc.rpartition("@")[2]
    if host.startswith("["):
        inside, _, after = host[1:].partition("]")
        try:
            ipaddress.IPv6Address(inside.partition("%")[0])  # a zone (%eth0) may follow
        except ValueError:
            return "the host in [brackets] is not an IPv6 address"
        if after and not after.startswith(":"):
            return "the host in [brackets] is followed by something that is not :PORT"
    elif not u.hostname:
        return "the URL names no host"
    try:
        port = u.port
    except ValueError:
        port = 0
    if port == 0:
        return "the port must be a number from 1 to 65535"
    return None


#: a query parameter whose name holds one of these carries a credential (api-key, api_key,
#: access_token, client_secret, password, sig, X-Amz-Signature, auth, ...)
_SECRET_PARAM = re.compile(
    r"key|token|secret|passw|sig|auth|credential|^code$", re.IGNORECASE
)  # code: Azure Functions' function key
#: the user:password@ of a URL (or of a string too malformed to parse as one)
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#]*@")


def redact_url(url: str) -> str:
    """``url`` with any user:password, and the value of each query parameter that carries a
    credential (see ``_SECRET_PARAM``), replaced by ``***``: for everything stored or printed.
    Text only, no parsing: a URL too malformed to parse (an error quotes it) is redacted too."""
    head, hash_, fragment = url.partition("#")
    head, mark, query = head.partition("?")
    head = _USERINFO.sub(lambda m: f"{m[1] or ''}***@", head, count=1)
    if mark:
        query = "&".join(_redact_param(p) for p in query.split("&"))
    return head + mark + query + hash_ + fragment


def _redact_param(param: str) -> str:
    name, eq, value = param.partition("=")
    if eq and value and _SECRET_PARAM.search(unquote_plus(name)):
        return f"{name}=***"
    return param


@dataclass(frozen=True)
class BackendKind:
    """A backend kind: its manifest table's model, where its implementation lives (imported only
    when a backend of that kind is made, so the manifest never pulls in aiohttp, torch or vLLM),
    and whether it returns the model's exact ids (a local engine: its datasets serve as ground
    truth)."""

    kind: str
    config: type[BaseModel]
    #: "module:Class", a Backend whose constructor is (name, cfg, manifest, bound)
    implementation: str
    #: returns the model's exact ids by construction
    exact_ids: bool
    summary: str
    #: "module:function" that reads this kind's stored answer body back into a
    #: ``records.ApiView`` (None for a body it does not know); None: the body is OpenAI's
    #: chat-completions shape, or a local engine's ids
    reader: str | None = None


BACKENDS: dict[str, BackendKind] = {
    b.kind: b
    for b in (
        BackendKind(
            "hf",
            HFBackendCfg,
            "draftdata.generate.backends.local:HFBackend",
            True,
            "the target through transformers on CPU or CUDA (exact ids)",
        ),
        BackendKind(
            "openai",
            OpenAIBackendCfg,
            "draftdata.generate.backends.openai_api:OpenAIBackend",
            False,
            "any OpenAI-compatible chat-completions API (ids where the server returns them)",
            reader="draftdata.records.wire:view_from_record",
        ),
        BackendKind(
            "vllm",
            EngineBackendCfg,
            "draftdata.generate.backends.engines:VLLMBackend",
            True,
            "vLLM's offline engine, where installed (exact ids)",
        ),
        BackendKind(
            "sglang",
            EngineBackendCfg,
            "draftdata.generate.backends.engines:SGLangBackend",
            True,
            "SGLang's offline engine, where installed (exact ids)",
        ),
    )
}

#: the kinds draftdata itself implements: a plugin adds kinds beside them, never replaces one
BUILT_IN = frozenset(BACKENDS)


def backend_union() -> Any:
    """The manifest's tagged union over the table's config models, told apart by ``kind``."""
    return Annotated[
        Union[tuple(dict.fromkeys(b.config for b in BACKENDS.values()))],  # noqa: UP007
        Field(discriminator="kind"),
    ]


if TYPE_CHECKING:
    BackendCfg = HFBackendCfg | OpenAIBackendCfg | EngineBackendCfg
else:  # the manifest's tagged union, made from the table above
    BackendCfg = backend_union()

#: called, in order, each time ``BACKENDS`` changes (``follow_backends``)
_FOLLOWERS: list[Callable[[], None]] = []


def follow_backends(fn: Callable[[], None]) -> None:
    """Call ``fn`` each time a kind is registered or unregistered: what is built from
    ``BACKENDS`` (the manifest's model) follows it without this module importing it."""
    if fn not in _FOLLOWERS:
        _FOLLOWERS.append(fn)


def _changed() -> None:
    for fn in _FOLLOWERS:
        fn()


def answer_reader(kind: str) -> Callable[[Any], Any] | None:
    """The function that reads ``kind``'s stored answers (``BackendKind.reader``), imported
    when first asked for; None where the kind reads as OpenAI's shape or is not registered."""
    entry = BACKENDS.get(kind)
    if entry is None or entry.reader is None:
        return None
    module, _, name = entry.reader.partition(":")
    fn: Callable[[Any], Any] = getattr(importlib.import_module(module), name)
    return fn


#: the entry point group a package registers its backend kinds under (the module it names is
#: imported; its ``register_backend`` calls do the rest)
PLUGIN_GROUP = "draftdata.backends"
_PLUGINS: dict[str, str] = {}


def load_plugins() -> dict[str, str]:
    """Import every module installed under the ``draftdata.backends`` entry point group, once
    per process: name -> module. One that fails to import is refused in one line, naming it."""
    from importlib.metadata import entry_points

    from ..errors import InputError

    for ep in entry_points(group=PLUGIN_GROUP):
        if ep.name in _PLUGINS:
            continue
        try:
            ep.load()
        except Exception as e:  # a plugin's own failure, named in one line
            raise InputError(
                f"backend plugin {ep.name!r} ({ep.value}, entry point group {PLUGIN_GROUP}) "
                f"failed to load: {type(e).__name__}: {e}; fix or uninstall it"
            ) from None
        _PLUGINS[ep.name] = ep.value
    return dict(_PLUGINS)


def register_backend(entry: BackendKind) -> None:
    """Add a backend kind from outside draftdata, in one call: the table gets the entry and the
    manifest accepts ``kind = "<entry.kind>"`` with ``entry.config``'s keys from then on (the
    manifest model is rebuilt over the new union). ``entry.config`` must be a pydantic model
    whose ``kind`` is ``Literal["<entry.kind>"]``; ``entry.implementation`` names, as
    "module:Class", a ``generate.backends.base.Backend``. Registering a kind again replaces it
    (a module imported twice); a built-in kind cannot be replaced."""
    if entry.kind in BUILT_IN:
        raise ValueError(f"backend kind {entry.kind!r} is built in; register under another name")
    field = entry.config.model_fields.get("kind")
    if field is None or get_args(field.annotation) != (entry.kind,):
        raise ValueError(
            f"{entry.config.__name__} must have kind: Literal[{entry.kind!r}] (the manifest "
            "tells backend tables apart by it)"
        )
    if ":" not in entry.implementation:
        raise ValueError(f'implementation {entry.implementation!r}: write it as "module:Class"')
    BACKENDS[entry.kind] = entry
    _changed()


def unregister_backend(kind: str) -> None:
    """Take a registered kind out again (a built-in kind stays)."""
    if kind in BUILT_IN:
        raise ValueError(f"backend kind {kind!r} is built in")
    if BACKENDS.pop(kind, None) is not None:
        _changed()
