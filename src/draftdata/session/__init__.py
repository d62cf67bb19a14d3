"""A run folder as a command opens it (:class:`Run`): the frozen manifest, the ledger, and how
the run turns text into ids (its :class:`~draftdata.tokens.target.Target`), with the folder's
lock and the writer's admission only for a command that writes.

``run``, ``generate`` and ``score`` open it to write; ``export``, ``status`` and the library's
``draftdata.open_run`` open it to read, so they run beside a writer and change nothing of the
run's own record (its command line, its manifest, its requests in flight)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from ..config import Manifest
from ..errors import InputError
from ..formats import BoundFormat, get_format
from ..store.ledger import Ledger
from ..store.lock import RunLock
from ..store.meta import COMMAND_LINE, LIMIT, MANIFEST, MANIFEST_BASE_DIR, SETTINGS
from ..tokenizers import load_tokenizer
from ..tokens.checks import RunChecks
from ..tokens.run_samples import RunTokens
from ..tokens.target import Target
from .settings import check, settings_of, stored_manifest

if TYPE_CHECKING:
    import pyarrow as pa

    from ..records import Sample
    from ..store.stats import RunStatus

__all__ = ["Run", "bind_target", "open_run", "target_of"]


def open_run(path: str | Path) -> Run:
    """The run folder ``path`` (``runs/demo``: the folder holding ``ledger.sqlite``), opened to
    read with the manifest it was made with: ``samples()``, ``to_arrow()``, ``status()`` and
    its ``target``. It takes no lock: it reads beside a writer. Close it, or use it in a
    ``with`` block."""
    from ..store.runs import manifest_of_run

    folder = Path(path)
    if not (folder / "ledger.sqlite").is_file():
        raise InputError(f"{folder}: no ledger.sqlite here; open_run takes a run folder")
    m = manifest_of_run(folder)
    m.run.output = str(folder.resolve())
    return Run.open(m, write=False)


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
    """The run's target: the manifest's tokenizer bound to its format, its thinking option, and
    its split preferences, checked against the tokenizer they were learned with: those the run
    learned (RUN/prefs.json, where ``[run] learn_prefs`` is set and a run has learned them: a
    later ``generate`` or ``export`` makes samples as the run did), else the file ``[target]
    prefs`` names. ``prefs=False``: without them (a plan renders prompts only)."""
    bound = bind_target(m)
    target = Target(bound, thinking=m.target.thinking)
    learned = m.output_dir / "prefs.json"
    if not prefs:
        return target
    if m.run.learn_prefs and learned.is_file():
        path = learned
    elif m.target.prefs:
        path = m.resolve(m.target.prefs)
    else:
        return target
    from ..tokens.prefs import SplitPrefs

    rules = SplitPrefs.load(path)
    rules.check_tokenizer(bound.tokenizer, path)
    return target.with_prefs(rules.applier(bound.tokenizer))


class Run:
    """One command's hold on a run folder (``manifest.output_dir``): its manifest, its ledger
    and its :class:`~draftdata.tokens.target.Target`. Open it with :meth:`open` (or
    ``draftdata.open_run`` to read one); close it (or use it as a context manager) to free the
    folder.

    A writer is admitted here, and only here (``generate``, ``run`` and ``score`` all open
    their run so): the folder's lock, the owner check, the requests a killed writer left in
    flight settled (counted as possibly paid, asked again), the settings drift check (a rerun
    that would stamp answers with settings that did not make them is refused), and the
    manifest and the command line recorded where the command is the run's own."""

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
        #: datasets whose source file changed since the run began: read again (the drift check)
        self.reread: set[str] = set()

    def samples(self, datasets: Iterable[str] | None = None) -> Iterator[Sample]:
        """The run's samples (every dataset's, or those ``datasets`` names), streamed from its
        ledger in key order: the ids exactly as ``export`` writes them, every filter off."""
        for name in self._names(datasets):
            yield from self.ledger.samples.of(name)

    def to_arrow(self, datasets: Iterable[str] | None = None) -> pa.Table:
        """The run's samples as one Arrow table, with the columns of the export's shards
        (``records.arrow.SHARD_SCHEMA``; each prompt's metadata as JSON)."""
        from ..records.arrow import SHARD_SCHEMA, shard_row, table_of

        rows = [
            shard_row(s, meta)
            for name in self._names(datasets)
            for s, meta in self.ledger.samples.with_metadata(name)
        ]
        return table_of(rows, SHARD_SCHEMA)

    def status(self) -> RunStatus:
        """What the ledger holds: per dataset, prompts, answers, samples, drops and warnings,
        and what was spent (``draftdata status``)."""
        from ..store.stats import status

        return status(self.ledger)

    def _names(self, datasets: Iterable[str] | None) -> list[str]:
        names = [d.name for d in self.manifest.datasets]
        if datasets is None:
            return names
        wanted = list(datasets)
        if unknown := [n for n in wanted if n not in names]:
            raise InputError(
                f"{self.manifest.output_dir}: no dataset {unknown[0]!r} in this run; it has "
                f"{', '.join(names)}"
            )
        return wanted

    def tokens_stage(self, target: Target, console: Console | None) -> RunTokens:
        """The run's tokens stage (``tokens.run_samples``) with ``target``: the run's own, or
        one learned since it opened."""
        return RunTokens(self.ledger, self.manifest, target, self.checks, console)

    @classmethod
    def open(
        cls,
        manifest: Manifest,
        *,
        write: bool,
        what: str = "draftdata",
        command_line: list[str] | None = None,
        own: bool = True,
        extend: bool = False,
        console: Console | None = None,
    ) -> Run:
        """``write``: take the folder's lock first (a second writer is refused at once, before
        it can pay for anything; ``what`` names this one to it) and admit the writer
        (:meth:`_admit`): ``own`` (the run's own command: ``run``, ``generate``) records the
        manifest and ``command_line``; ``score`` is not, and leaves them; ``extend`` lets a
        dataset's ``limit`` grow; ``console`` says what was settled. Reading takes no lock and
        needs the folder's ledger to exist; it opens the ledger for writing where the folder
        can be written (``export`` makes the samples the tokens stage has not made yet: the
        same rows a writer would make, ``INSERT OR REPLACE``), read-only where it cannot."""
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
            run = cls(manifest, ledger, target, lock)
            if write:
                try:
                    check_owner(manifest, ledger)
                    run._admit(command_line if own else None, own, extend, console)
                except BaseException:
                    ledger.close()
                    raise
            return run
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    def _admit(
        self, command_line: list[str] | None, own: bool, extend: bool, console: Console | None
    ) -> None:
        """A writer's admission, before it sends or writes anything: requests in flight when
        the last writer was killed settled (possibly paid, so counted against the budget, and
        asked again); each dataset's settings checked against those that made its answers
        (``session.settings``); the manifest (and the command line, the report's "made by")
        recorded where ``own``."""
        m, meta = self.manifest, self.ledger.meta
        n, usd = self.ledger.answers.settle_interrupted()
        if n and console is not None:
            console.print(
                Text(
                    f"{n} request(s) were in flight when the last run stopped: counted as "
                    f"possibly paid (up to ${usd:,.4f}) and asked again"
                )
            )
        for d in m.datasets:
            now = settings_of(m, d, self.target.bound)
            was, limit = meta.get(SETTINGS.of(d.name)), meta.get(LIMIT.of(d.name), d.limit)
            if check(m, d, now, was, limit, extend):
                self.reread.add(d.name)
            meta.put(SETTINGS.of(d.name), now)
            meta.put(LIMIT.of(d.name), d.limit)
        if own:
            meta.put(MANIFEST, stored_manifest(m))
            meta.put(MANIFEST_BASE_DIR, str(m.base_dir))
        if command_line is not None:
            meta.put(COMMAND_LINE, command_line)

    def close(self) -> None:
        """Close the ledger and free the folder for the next writer."""
        self.ledger.close()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
