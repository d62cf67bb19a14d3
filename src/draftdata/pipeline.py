"""`draftdata run`: read -> generate -> tokens -> validate -> export, each stage restartable.

The gate: datasets whose backend returns text wait until reconstruction, measured on the
manifest's ground-truth datasets (generated with exact ids by the same target), reaches
``[run] min_exact``. A failed gate stops the run before the first paid request; ``--force``
overrides it, and the override is recorded in the export manifest."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from . import __version__
from .errors import DraftdataError
from .export.shards import ShardWriter, now_iso, write_manifest
from .generate.runner import Runner
from .manifest import DatasetCfg, EngineBackendCfg, HFBackendCfg, Manifest
from .measure.validate import ValidationReport, validate
from .records.wire import messages_of
from .store.ledger import Key
from .tokens.reconstruct import FINISHED


class GateError(DraftdataError):
    """Reconstruction is not exact enough to spend money on text-only backends."""

    exit_code = 1


def is_ground_truth(m: Manifest, d: DatasetCfg) -> bool:
    """Generated with exact ids by the target itself (a local engine), unless the manifest says."""
    if d.ground_truth is not None:
        return d.ground_truth
    return isinstance(m.backends[d.backend], (HFBackendCfg, EngineBackendCfg))


@dataclass
class Gate:
    min_exact: float
    exact_match_rate: float | None
    passed: bool
    forced: bool = False
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "min_exact": self.min_exact,
            "exact_match_rate": self.exact_match_rate,
            "passed": self.passed,
            "forced": self.forced,
            "reason": self.reason,
        }


@dataclass
class PipelineResult:
    run_dir: Path
    export_dir: Path | None = None
    validation: ValidationReport | None = None
    gate: Gate | None = None
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    budget_stopped: bool = False


def ground_truth_records(runner: Runner, d: DatasetCfg) -> list[dict[str, Any]]:
    """The engine's exact answers as validation records (api_view derived from the ids)."""
    opts = {} if runner.m.target.thinking is None else {"thinking": runner.m.target.thinking}
    out = []
    for key, p, msgs, r, _view in runner.conversations(d):
        if r.output_ids is None:
            continue
        ids = list(r.output_ids)
        if r.finish_reason in FINISHED and (not ids or ids[-1] not in runner.bound.stop_ids):
            ids.append(runner.bound.end_id)
        out.append(
            {
                "id": f"{key.dataset}/{key.prompt_id}/{key.sample_idx}/{key.turn}",
                "group": key.prompt_id,
                "source": d.name,
                "messages": [
                    {
                        "role": m.role,
                        "content": m.content,
                        **({"reasoning_content": m.reasoning} if m.reasoning else {}),
                    }
                    for m in msgs
                ],
                "tools": list(p.tools),
                "prompt_ids": r.our_prompt_ids or runner.bound.prompt_ids(msgs, p.tools, **opts),
                "output_ids": ids,
                "finish_reason": r.finish_reason,
            }
        )
    return out


def run_pipeline(
    m: Manifest, *, force: bool = False, quiet: bool = False, console: Console | None = None
) -> PipelineResult:
    console = console or Console(stderr=True)
    runner = Runner(m, quiet=quiet, console=console)
    res = PipelineResult(run_dir=m.output_dir)
    try:
        gt = [d for d in m.datasets if is_ground_truth(m, d)]
        text = [d for d in m.datasets if not is_ground_truth(m, d)]
        # 1. read every dataset (duplicates across datasets are dropped in manifest order)
        for d in m.datasets:
            runner.prompts(d)
        # 2. ground truth: exact ids from the target itself
        if gt:
            rep = asyncio.run(runner.run([d.name for d in gt]))
            res.datasets.update(rep.datasets)
        # 3. validate reconstruction on it, and gate the text backends
        if gt:
            records = [r for d in gt for r in ground_truth_records(runner, d)]
            if m.run.learn_prefs and records:
                res.validation = learn_and_validate(runner, records)
            else:
                res.validation = validate(
                    runner.bound, records, text_ids=runner.text_ids, thinking=m.target.thinking
                )
            res.validation.meta = {
                **res.validation.meta,
                "format": runner.bound.format.name,
                "format_version": runner.bound.format.version,
                "tokenizer_sha256": runner.bound.tokenizer.sha256,
                "prefs": m.target.prefs,
            }
            (m.output_dir / "validation.json").write_text(
                json.dumps(res.validation.to_json(), indent=2, ensure_ascii=False) + "\n",
                encoding="utf-8",
            )
        rate = res.validation.exact_match_rate if res.validation and res.validation.n else None
        if not text:
            res.gate = Gate(m.run.min_exact, rate, True, reason="no text-only datasets")
        elif rate is None:
            res.gate = Gate(
                m.run.min_exact,
                None,
                False,
                reason="no ground-truth dataset to measure reconstruction on; add "
                'one generated by the target with a local engine (kind = "hf")',
            )
        else:
            res.gate = Gate(
                m.run.min_exact,
                rate,
                rate >= m.run.min_exact,
                reason=f"exact-match {rate:.4f} vs min_exact {m.run.min_exact}",
            )
        runner.ledger.set_meta("gate", res.gate.to_json())
        if text and not res.gate.passed:
            if not force:
                raise GateError(
                    f"gate failed before any paid request: {res.gate.reason}; fix the format or "
                    "learn split preferences (`draftdata learn`), or pass --force to override"
                )
            res.gate.forced = True
            runner.ledger.set_meta("gate", res.gate.to_json())
        # 4. the text backends
        if text:
            rep = asyncio.run(runner.run([d.name for d in text]))
            res.datasets.update(rep.datasets)
            res.budget_stopped = rep.budget_stopped
        # 5. export
        res.export_dir = export_run(
            runner, res.validation.to_json() if res.validation is not None else None, res.gate
        )
    finally:
        runner.ledger.close()
    return res


def learn_and_validate(runner: Runner, records: list[dict[str, Any]]) -> ValidationReport:
    """Learn split preferences from the run's own ground truth. The figure the gate sees is
    cross-validated: preferences learned on one half of the prompts are measured on the other,
    both ways. The preferences learned on all of it are saved (RUN/prefs.json) and applied to
    the text datasets."""
    from .measure.validate import learning_pairs
    from .tokens.prefs import _bucket, learn

    bound, thinking = runner.bound, runner.m.target.thinking
    halves = (
        [r for r in records if _bucket(r["group"]) < 0.5],
        [r for r in records if _bucket(r["group"]) >= 0.5],
    )
    report = ValidationReport()
    for learn_on, measure_on in ((halves[0], halves[1]), (halves[1], halves[0])):
        if not measure_on:
            continue
        pairs, _ = learning_pairs(bound, learn_on, thinking)
        applier = learn(bound.tokenizer, pairs).applier(bound.tokenizer) if pairs else None
        inner = validate(
            bound, measure_on, text_ids=applier, thinking=thinking, on_result=report.add
        )
        report.drops.update(inner.drops)
        report.warnings.update(inner.warnings)
    pairs, _ = learning_pairs(bound, records, thinking)
    prefs = learn(bound.tokenizer, pairs)
    prefs.save(runner.m.output_dir / "prefs.json")
    runner.text_ids = prefs.applier(bound.tokenizer)
    report.meta = {"prefs_rules": len(prefs.rules), "cross_validated": True}
    return report


def _template_sha(runner: Runner) -> str | None:
    tpl = runner.bound.tokenizer.chat_template
    return hashlib.sha256(tpl.encode()).hexdigest() if tpl else None


def export_run(
    runner: Runner,
    validation: dict[str, Any] | None,
    gate: Gate | None,
    shard_bytes: int | None = None,
) -> Path:
    """Parquet shards and manifest.json from the ledger's samples (re-runnable on its own)."""
    m, led = runner.m, runner.ledger
    folder = m.output_dir / "export"
    writer = ShardWriter(folder, **({"max_bytes": shard_bytes} if shard_bytes else {}))
    status = led.status()["datasets"]
    datasets: dict[str, Any] = {}
    totals: Counter[str] = Counter()
    n_samples = 0
    for d in m.datasets:
        meta = {p.id: p.metadata for p in led.prompts(d.name)}
        sources: Counter[str] = Counter()
        finishes: Counter[str] = Counter()
        n = 0
        for key, source, finish, ids, plen, warns in led.iter_samples(d.name):
            writer.add(_row(key, source, finish, ids, plen, warns, meta.get(key.prompt_id, {})))
            sources[source] += 1
            finishes[finish] += 1
            n += 1
        st = status.get(d.name, {})
        drops = dict(st.get("drops", {}))
        failed = st.get("failed", 0)
        if failed:
            drops["generation_failed"] = failed
        totals.update(drops)
        n_samples += n
        backend = m.backends[d.backend]
        datasets[d.name] = {
            "backend": d.backend,
            "backend_kind": backend.kind,
            "ground_truth": is_ground_truth(m, d),
            "source": d.source,
            "reader": d.reader,
            "sampling": d.sampling.model_dump(),
            "samples_per_prompt": d.samples_per_prompt,
            "turns": d.turns,
            "samples": n,
            "token_sources": dict(sources),
            "finish_reasons": dict(finishes),
            "drops": drops,
            "read_drops": led.get_meta(f"read_drops:{d.name}", {}),
            "cost_usd": st.get("cost_usd", 0.0),
        }
    shards = writer.close()
    tok = runner.bound.tokenizer
    doc = {
        "draftdata_version": __version__,
        "run": m.run.name,
        "created_at": now_iso(),
        "tokenizer": {
            "path": str(tok.path),
            "sha256": tok.sha256,
            "chat_template_sha256": _template_sha(runner),
        },
        "format": {"name": runner.bound.format.name, "version": runner.bound.format.version},
        "datasets": datasets,
        "counts": {"samples": n_samples, "drops": dict(totals)},
        "validation": validation,
        "gate": gate.to_json() if gate is not None else led.get_meta("gate"),
        "shards": shards,
        "cost_usd": led.status()["cost_usd"],
        "loader": "datasets.load_dataset('parquet', data_files='export/shard-*.parquet')",
    }
    write_manifest(folder, doc)
    return folder


def _row(
    key: Key,
    source: str,
    finish: str,
    ids: list[int],
    plen: int,
    warns: list[str],
    meta: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": f"{key.dataset}/{key.prompt_id}/{key.sample_idx}/{key.turn}",
        "dataset": key.dataset,
        "prompt_id": key.prompt_id,
        "sample_idx": key.sample_idx,
        "turn": key.turn,
        "input_ids": ids,
        "loss_mask": [False] * plen + [True] * (len(ids) - plen),
        "prompt_len": plen,
        "token_source": source,
        "finish_reason": finish,
        "warnings": warns,
        "metadata": json.dumps(meta, ensure_ascii=False, default=str),
    }


def export_trainer(runner: Runner, kind: str) -> Path:
    """SpecForge conversations JSONL (reasoning as ``reasoning_content``) or speculators JSONL
    (``input_ids`` + ``loss_mask`` as 0/1), beside the shards."""
    m, led = runner.m, runner.ledger
    folder = m.output_dir / "export"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.jsonl"
    tmp = folder / f".{kind}.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        for d in m.datasets:
            if kind == "speculators":
                for key, _src, _fin, ids, plen, _w in led.iter_samples(d.name):
                    f.write(
                        json.dumps(
                            {
                                "id": f"{key.dataset}/{key.prompt_id}/{key.sample_idx}/{key.turn}",
                                "input_ids": ids,
                                "loss_mask": [0] * plen + [1] * (len(ids) - plen),
                            }
                        )
                        + "\n"
                    )
                continue
            have = {k for k, *_ in led.iter_samples(d.name)}
            for key, p, msgs, _r, view in runner.conversations(d):
                if key not in have:
                    continue  # dropped at the tokens stage: not training data
                conv = [
                    _conv_msg(x.role, x.content, x.reasoning, x.tool_calls, x.tool_call_id)
                    for x in msgs
                ]
                conv.append(
                    _conv_msg(
                        "assistant", view.content or "", view.reasoning, view.tool_calls, None
                    )
                )
                rec: dict[str, Any] = {
                    "id": f"{key.dataset}/{key.prompt_id}/{key.sample_idx}/{key.turn}",
                    "conversations": conv,
                }
                if p.tools:
                    rec["tools"] = list(p.tools)
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def _conv_msg(
    role: str, content: str | None, reasoning: str | None, calls: Any, call_id: str | None
) -> dict[str, Any]:
    d: dict[str, Any] = {"role": role, "content": content or ""}
    if reasoning:
        d["reasoning_content"] = reasoning
    if calls:
        d["tool_calls"] = [
            {"id": c.id, "type": c.type, "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    if call_id:
        d["tool_call_id"] = call_id
    return d


__all__ = [
    "GateError",
    "export_run",
    "export_trainer",
    "is_ground_truth",
    "messages_of",
    "run_pipeline",
]
