"""The page's sample viewer (the first samples of each dataset, token by token, from the export's
``preview.json``) and its run section (the command line and the run's manifest, from the
ledger). Every text from the run is escaped."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ..export.preview import PreviewSample, PreviewToken
from .page import PageBase, plural
from .svg import esc, hint

#: values of manifest keys named like this are not shown
SECRET_KEY = re.compile(r"(api_?key|secret|password|authorization)$", re.IGNORECASE)
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


# --- tokens ----------------------------------------------------------------------------------
def _visible(text: str) -> str:
    """A token's text as markup: escaped, with each newline shown as a ↵ before the break."""
    return esc(text).replace("\n", '<span class="nl">↵</span>\n')


def token_span(t: PreviewToken) -> str:
    """One token: a span whose title gives its id and its repr; control tokens (and ids the
    tokenizer has no entry for) are chips that show their id."""
    what = "no such id in the tokenizer" if t.text is None else repr(t.text)
    flags = ("control" if t.control else "", "trained" if t.trained else "prompt")
    title = f"id {t.id} · {what} · " + " · ".join(f for f in flags if f)
    cls = "t tr" if t.trained else "t"
    if t.control or t.text is None:
        return (
            f'<span class="{cls} c" title="{esc(title)}">{esc(t.text or "?")}'
            f'<span class="cid">{t.id}</span></span>'
        )
    return f'<span class="{cls}" title="{esc(title)}">{_visible(t.text)}</span>'


def sample_card(s: PreviewSample, tokenizer_sha256: str, *, open_: bool = True) -> str:
    """One sample, folded unless ``open_``: a line about it, then its tokens."""
    answer = s.length - s.prompt_len
    shown = (
        f"all {s.length:,} tokens"
        if s.start == 0 and s.end == s.length
        else f"tokens {s.start:,}–{s.end:,} of {s.length:,}"
    )
    head = (
        f'<summary><b>{esc(s.id)}</b> <span class="muted">{esc(s.token_source)} ids · '
        f"finish {esc(s.finish_reason)} · {s.prompt_len:,} prompt + {answer:,} answer tokens · "
        f"showing {shown}</span>"
        + "".join(f' <span class="wtag">{esc(w)}</span>' for w in s.warnings)
        + "</summary>"
    )
    note = ""
    if s.tokenizer_sha256 and tokenizer_sha256 and s.tokenizer_sha256 != tokenizer_sha256:
        note = hint(
            f"Made under tokenizer {esc(s.tokenizer_sha256[:16])}…; these texts come from the "
            f"export's tokenizer {esc(tokenizer_sha256[:16])}… and may not match its ids."
        )
    before = (
        f'<span class="cut">… {plural(s.start, "earlier prompt token")} not shown …</span>\n'
        if s.start > 0
        else ""
    )
    rest = s.length - s.end
    after = (
        f'\n<span class="cut">… {rest:,} more answer token{"" if rest == 1 else "s"} not shown'
        "</span>"
        if rest > 0
        else ""
    )
    body = "".join(token_span(t) for t in s.tokens)
    return (
        f'<details class="sample"{" open" * open_}>{head}{note}'
        f'<div class="toks">{before}{body}{after}</div></details>'
    )


LEGEND = (
    '<p class="legend"><span class="t">prompt (not trained)</span> '
    '<span class="t tr">trained (loss_mask true)</span> '
    '<span class="t c">control token<span class="cid">id</span></span> '
    '<span class="muted">Hover a token for its id and its text as a Python string.</span></p>'
)


# --- the manifest as TOML-ish text -------------------------------------------------------------
def _key(k: str) -> str:
    return k if BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False)


def _value(k: str, v: Any) -> str:
    if SECRET_KEY.search(k) and v:
        return '"(hidden)"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, Mapping):
        inner = ", ".join(
            f"{_key(str(a))} = {_value(str(a), b)}" for a, b in v.items() if b is not None
        )
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(v, list):
        return "[" + ", ".join(_value(k, x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)


def _tables(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def _table(v: Any) -> bool:
    return isinstance(v, Mapping) and bool(v)  # an empty one is written inline: {}


def tomlish(doc: Mapping[str, Any], prefix: str = "") -> list[str]:
    """A manifest as TOML-like lines: scalars first, then [tables] and [[arrays of tables]]
    (whose own sub-tables are inline). Unset (null) values are left out."""
    lines = [
        f"{_key(k)} = {_value(k, v)}"
        for k, v in doc.items()
        if v is not None and not _table(v) and not _tables(v)
    ]
    for k, v in doc.items():
        name = f"{prefix}{_key(k)}"
        if _table(v):
            if any(b is not None and not _table(b) and not _tables(b) for b in v.values()):
                lines += ["", f"[{name}]"]  # a header only where the table has its own keys
            lines += tomlish(v, f"{name}.")
        elif _tables(v):
            for item in v:
                lines += ["", f"[[{name}]]"]
                lines += [f"{_key(a)} = {_value(a, b)}" for a, b in item.items() if b is not None]
    return lines


def command(argv: Sequence[str]) -> str:
    return shlex.join(argv)


# --- sections --------------------------------------------------------------------------------
class ViewerSections(PageBase):
    def samples(self) -> str:
        out = ["<h2 id=samples>Samples</h2>"]
        pv = self.d.preview
        if pv is None:
            out.append(
                hint(
                    "This export has no <code>export/preview.json</code> (older exports wrote "
                    "none), so no samples can be shown here. Re-run "
                    f"<code>draftdata export {esc(self.d.run_dir)}</code> to add it."
                )
            )
            return "".join(out)
        per = max((len(v) for v in pv.datasets.values()), default=0)
        out += [
            hint(
                f"The first {plural(per, 'sample')} of each dataset as the shards hold them, "
                "decoded token by token with the export's tokenizer (click a sample to fold or "
                "unfold it). A long sample shows the end of its prompt and the start of its "
                "answer."
            ),
            LEGEND,
        ]
        for name in self.d.datasets:
            got = pv.datasets.get(name)
            out.append(f"<h3>{self.ds(name) if name in self.colors else esc(name)}</h3>")
            if got is None:
                out.append(hint("Not in this export's preview."))
            elif not got:
                out.append(hint("This dataset kept no samples."))
            else:
                out += [
                    sample_card(s, pv.tokenizer_sha256, open_=i == 0) for i, s in enumerate(got)
                ]
        return "".join(out)

    def run_section(self) -> str:
        out = ["<h2 id=run>Command and manifest</h2>"]
        argv, cfg = self.d.command_line, self.d.run_manifest
        if argv:
            out.append(
                '<p>The command that last opened this run:</p><pre class="cmd"><code>'
                f"{esc(command(argv))}</code></pre>"
            )
        else:
            out.append(hint("The ledger records no command line (it predates their recording)."))
        if cfg:
            lines = tomlish(cfg)
            out.append(
                f"<details open><summary>The run's manifest as it was loaded "
                f"({plural(len(lines), 'line')}; unset values left out)</summary>"
                f'<pre class="cfg">{esc(chr(10).join(lines).strip())}</pre></details>'
            )
        elif self.d.ledger is None:
            out.append(hint("No ledger.sqlite in the run folder: the run's manifest is not known."))
        else:
            out.append(hint("The ledger records no manifest."))
        return "".join(out)
