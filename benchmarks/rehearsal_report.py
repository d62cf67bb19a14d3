"""The rehearsal's figures (`benchmarks/rehearsal.py`) as one markdown table, then the checks
and the datasets."""

from __future__ import annotations

from typing import Any


def _f(v: Any, nd: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    gen = doc.get("generation", {})
    lines = [
        f"## Rehearsal: {doc['prompts']:,} prompts, {doc.get('answers_expected', 0):,} answers "
        f"(wall {_f(doc.get('wall_s_total'))} s; {m['cpus']} CPUs, load "
        f"{m['load_avg_at_start'][0]} at start, {m.get('load_avg_at_end', ['–'])[0]} at end)",
        "",
        "| phase | wall s | draftdata CPU s | answers | CPU s / 1k answers | peak RSS MB, "
        "largest process (getrusage; * sampled) | peak PSS MB, process tree (sampled) | "
        "peak anonymous MB, process tree (sampled; a forked worker's shared pages count again) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def mem(p: dict[str, Any]) -> str:
        star = "*" if p.get("rss_source") == "sampled" else ""
        return (
            f"{_f(p['peak_rss_mb'])}{star} | {_f(p['peak_pss_tree_mb'])} | "
            f"{_f(p.get('peak_anon_tree_mb'))}"
        )

    for p in doc.get("phases", []):
        lines.append(
            f"| {p['phase']} | {_f(p['wall_s'])} | {_f(p['cpu_s'])} | {_f(p['answers'])} | "
            f"{_f(p['cpu_s_per_1k'], 2)} | {mem(p)} |"
        )
    for name, lay in doc.get("layouts", {}).items():
        lines.append(
            f"| layout {name}: `export --as` less `export` (peaks: the whole command) | "
            f"{_f(lay['layout_wall_s'])} | {_f(lay['layout_cpu_s'])} | {_f(lay['answers'])} | "
            f"– | {mem(lay)} |"
        )
    rep = doc.get("report", {})
    ch = rep.get("chromium") or {}
    paint = ch.get("paint") or {}
    nav = ch.get("nav") or {}
    res = doc.get("resume", {})
    kill = doc.get("kill", {})
    st_live = doc.get("status_live") or {}
    lines += [
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| answers in the ledger at the kill (target) | {_f(kill.get('answers_in_ledger_after_kill'))}"
        f" ({_f(kill.get('target_answers'))}); requests open in flight "
        f"{_f(kill.get('open_in_flight_rows'))} |",
        f"| resume to its first new request | {_f(res.get('to_first_new_request_s'), 2)} s |",
        f"| generation, first request to last answer (both runs, with the gap) | "
        f"{_f(gen.get('first_request_to_last_answer_s'))} s |",
    ]
    scale = doc.get("time_scale") or 1.0
    for when, fl in gen.get("in_flight", {}).items():
        reach = fl.get("s_to_reach") or {}
        real = f"; at real latency (÷ time scale {scale}) {reach['16'] / scale / 3600:.2f} h to 16"
        lines.append(
            f"| requests in flight {when.replace('_', ' ')} (concurrency "
            f"{doc.get('manifest', {}).get('concurrency')}): mean / max; s from the first request "
            f"to 16, 64, 256 at once | {_f(fl.get('mean'))} / {_f(fl.get('max'))}; "
            f"{', '.join(f'{k}: {v}' for k, v in reach.items()) or '–'}"
            f"{real if '16' in reach else ''} |"
        )
    if gen.get("sum_of_tails_s") is not None:
        lines.append(
            "| datasets one after another: sum of their tails (last request sent to last "
            f"answer in) | {_f(gen['sum_of_tails_s'])} s; at real latency "
            f"{gen['sum_of_tails_s'] / scale / 3600:.2f} h |"
        )
    for p in doc.get("phases", [])[:2]:
        rate = p["answers"] / p["wall_s"] if p["wall_s"] else None
        lines.append(f"| answers/s, {p['phase']} | {_f(rate)} |")
    lines += [
        f"| ledger bytes per answer | {_f(doc.get('ledger_bytes_per_answer'))} "
        f"({_f(doc.get('ledger_bytes', 0) / 1e6)} MB) |",
        f"| export bytes (every layout) | {_f(doc.get('export_bytes', 0) / 1e6)} MB |",
        f"| `status --json` latency, live at {_f(st_live.get('answers_then'))} answers | "
        f"{_f(st_live.get('s'), 2)} s |",
        f"| `status --json` latency, finished run (3 runs) | "
        f"{', '.join(_f(x, 2) for x in doc.get('status_final_s', []))} s |",
        f"| report size | {_f((rep.get('bytes') or 0) / 1e6, 2)} MB |",
        f"| report first paint / first contentful paint (Chromium, ms) | "
        f"{_f(paint.get('first-paint'), 0)} / {_f(paint.get('first-contentful-paint'), 0)} |",
        f"| report DOMContentLoaded / load (ms); load wall (s) | {_f(nav.get('dcl'), 0)} / "
        f"{_f(nav.get('load'), 0)}; {_f(ch.get('load_wall_s'), 2)} |",
        f"| report DOM nodes; JS heap MB; scroll to end and paint (ms) | {_f(ch.get('nodes'))}; "
        f"{_f((ch.get('heap') or 0) / 1e6)}; {_f(ch.get('scroll_to_end_ms'), 0)} |",
    ]
    if ch.get("error"):
        lines.append(f"| report in Chromium | {ch['error']} |")
    c = doc.get("checks", {})
    srv = doc.get("server", {})
    lines += [
        f"| served requests (server) = attempts (ledger) less those never sent (open at the "
        f"kill, unseen by the server) | {_f(c.get('served_requests'))} = "
        f"{_f(c.get('ledger_attempts'))} - {_f(c.get('attempts_never_sent'))}: "
        f"{'yes' if c.get('served_equals_attempts_sent') else 'NO'} |",
        f"| attempts by outcome | {gen.get('attempts')} |",
        f"| samples + drops = answers, every dataset (status and export manifest) | "
        f"{'yes' if c.get('all_ok') else 'NO (see below)'} |",
        f"| answers the server finished that the ledger did not keep (asked again) | "
        f"{_f(c.get('completed_not_kept'))} |",
        f"| cost: ledger / server's usage.cost of finished answers; possibly paid (interrupted) | "
        f"${_f(c.get('cost_usd_ledger'), 2)} / ${_f(c.get('cost_usd_server'), 2)}; "
        f"${_f(c.get('possibly_paid_usd'), 2)} |",
        f"| server: streamed / whole / disconnected; events; max in flight | "
        f"{_f(srv.get('streamed'))} / {_f(srv.get('whole'))} / {_f(srv.get('disconnected'))}; "
        f"{_f(srv.get('events'))}; {_f(srv.get('max_in_flight'))} |",
        f"| count witness: samples whose ids disagree with the server's usage "
        f"(count_mismatch), of all samples | {_f(_counted(doc, 'count_mismatch'))} of "
        f"{_f(_counted(doc, None))} |",
        f"| server: completion tokens (reasoning); finish reasons | "
        f"{_f(srv.get('completion_tokens'))} ({_f(srv.get('reasoning_tokens'))}); "
        f"{srv.get('finish')} |",
        f"| modelled real wall at this concurrency (sum of unscaled latencies / concurrency) | "
        f"{_f(srv.get('modelled_latency_s', 0) / doc.get('manifest', {}).get('concurrency', 1) / 3600, 2)} h |",
    ]
    lines += [
        "",
        "| dataset | reader | turns | prompts | answers | status total | samples | drops "
        "| export samples | export drops | ok |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | --- |",
    ]
    for name, d in c.get("datasets", {}).items():
        meta = doc["datasets"][name]
        lines.append(
            f"| {name} | {meta['reader']} | {meta['turns']} | {_f(meta['prompts'])} | "
            f"{_f(d['answers_expected'])} | {_f(d['status_total'])} | {_f(d['status_samples'])} "
            f"| {d['status_drops'] or ''} | {_f(d['export_samples'])} | {d['export_drops'] or ''}"
            f" | {'yes' if d['status_ok'] and d['export_ok'] and not d['duplicates'] else 'NO'} |"
        )
    return "\n".join(lines)


def _counted(doc: dict[str, Any], warning: str | None) -> int:
    """Samples of every dataset (``status``) carrying ``warning``; all samples where None."""
    per = (doc.get("checks") or {}).get("datasets") or doc.get("datasets") or {}
    if warning is None:
        return sum(d.get("status_samples") or 0 for d in per.values())
    return sum((d.get("warnings") or {}).get(warning, 0) for d in per.values())
