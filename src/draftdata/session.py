"""A run folder as a command opens it: the frozen manifest, the ledger, and how the run turns
text into ids (its :class:`~draftdata.tokens.target.Target`), with the folder's lock only for a command that writes.

``run`` and ``generate`` (the :class:`~draftdata.generate.runner.Runner`) and ``score`` open it
to write; ``export`` opens it to read, so it runs beside a writer and changes nothing of the
run's own record (its command line, its manifest, its requests in flight)."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from rich.console import Console

from .config import Manifest
from .errors import InputError
from .formats import BoundFormat, get_format
from .store.ledger import Ledger
from .store.lock import RunLock
from .store.meta import MANIFEST, MANIFEST_BASE_DIR
from .tokenizers import load_tokenizer
from .tokens.checks import RunChecks
from .tokens.run_samples import RunTokens
from .tokens.target import Target

__all__ = ["RunSession", "bind_target", "target_of"]


def bind_target(m: Manifest) -> BoundFormat:
    """The target's tokenizer bound to its chat format, as the manifest names them."""
    t = m.target
    tok = load_tokenizer(
        m.resolve(t.tokenizer) if not t.tokenizer.startswith("pkg:") else t.tokenizer,
        m.resolve(t.chat_template) if t.chat_template else None,
    )
    return get_format(t.format, relative_to=m.base_dir).bind(tok)


def check_owner(manifest: Manifest, ledger: Ledger) -> None:
    """A writer's manifest is the run's own. Another manifest whose output leads here (a
    symlink, a copied path) would otherwise add its prompts to this ledger and replace this
    run's export with its own datasets'. It is another one where the ledger's stored manifest
    has another ``[run] name``, or, of the same name (names repeat: a template copied), lies in
    another folder and shares none of its datasets. ``force_output`` lets it write all the
    same. (A dataset renamed in the run's own manifest, in its own folder, is said as such by
    the generate stage.)"""
    was = ledger.meta.get(MANIFEST)
    if not isinstance(was, dict) or manifest.run.force_output:
        return
    name = (was.get("run") or {}).get("name")
    had = {d.get("name") for d in was.get("datasets") or [] if isinstance(d, dict)}
    names = {d.name for d in manifest.datasets}
    if name == manifest.run.name:
        base = ledger.meta.get(MANIFEST_BASE_DIR)
        elsewhere = base is not None and Path(base).resolve() != manifest.base_dir.resolve()
        if not (elsewhere and had and not had & names):
            return
    out = manifest.output_dir
    raise InputError(
        f"{out} holds the run {name!r} (datasets {', '.join(sorted(map(str, had))) or 'none'}), "
        f"made by another manifest than this one (run {manifest.run.name!r}, datasets "
        f"{', '.join(sorted(names))}); give this run a [run] output of its own, or set "
        "force_output = true in [run] to write into it all the same"
    )


def target_of(m: Manifest, prefs: bool = True) -> Target:
    """The manifest's target: its tokenizer bound to its format, its thinking option, its
    ``prefs`` file applied if it names one (checked against the tokenizer it was learned
    with). ``prefs=False``: without them (a plan renders prompts only)."""
    bound = bind_target(m)
    target = Target(bound, thinking=m.target.thinking)
    if not (prefs and m.target.prefs):
        return target
    from .tokens.prefs import SplitPrefs

    path = m.resolve(m.target.prefs)
    learned = SplitPrefs.load(path)
    learned.check_tokenizer(bound.tokenizer, path)
    return target.with_prefs(learned.applier(bound.tokenizer))


class RunSession:
    """One command's hold on a run folder (``manifest.output_dir``). Open it with :meth:`open`;
    close it (or use it as a context manager) to free the folder."""

    def __init__(
        self, manifest: Manifest, ledger: Ledger, target: Target, lock: RunLock | None
    ) -> None:
        self.manifest = manifest
        self.ledger = ledger
        #: how the run turns text into ids (a stage that learns preferences makes a new one)
        self.target = target
        self.lock = lock
        #: the run's cross-answer quality checks (one answer index for every dataset)
        self.checks = RunChecks(manifest.run.drop)

    def tokens_stage(self, target: Target, console: Console | None) -> RunTokens:
        """The run's tokens stage (``tokens.run_samples``) with ``target``: the session's own,
        or one learned since it opened."""
        return RunTokens(self.ledger, self.manifest, target, self.checks, console)

    @classmethod
    def open(cls, manifest: Manifest, *, write: bool, what: str = "draftdata") -> RunSession:
        """``write``: take the folder's lock first (a second writer is refused at once, before it
        can pay for anything; ``what`` names this one to it). Reading takes no lock and needs
        the folder's ledger to exist; it opens the ledger for writing where the folder can be
        written (``export`` makes the samples the tokens stage has not made yet: the same rows
        a writer would make, ``INSERT OR REPLACE``), read-only where it cannot."""
        out = manifest.output_dir
        lock: RunLock | None = None
        if write:
            out.mkdir(parents=True, exist_ok=True)
            lock = RunLock(out).acquire(what)
        elif not (out / "ledger.sqlite").is_file():
            raise InputError(f"{out}: no ledger.sqlite here; is this a run folder?")
        try:
            target = target_of(manifest)
            path = out / "ledger.sqlite"
            writable = write or os.access(out, os.W_OK)
            ledger = Ledger(path) if writable else Ledger.read(path)
            if write:
                try:
                    check_owner(manifest, ledger)
                except InputError:
                    ledger.close()
                    raise
            return cls(manifest, ledger, target, lock)
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    def close(self) -> None:
        """Close the ledger and free the folder for the next writer."""
        self.ledger.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> RunSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
