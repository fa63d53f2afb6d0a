"""Results on disk: results.jsonl (one row per case x provider), a Markdown table per op with a
verdict per case, summary.md (headline table first, then every loss), and PNG plots (plots.py).

Rows are merged by key (op, size, dtype, mode, provider): a later row replaces an earlier one,
so ops run across several calls (or machines' folders, --merge) end up in one report.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from hearth.bench.providers import FUSED_PEERS, PROVIDERS

STATUSES = ("ok", "wrong", "error", "oom", "refuses", "unavailable", "skipped")


def row_key(r: dict) -> tuple:
    return (r["op"], r["size_label"], r["dtype"], r["mode"], r["provider"])


def case_key(r: dict) -> tuple:
    return (r["op"], r["size_label"], r["dtype"], r["mode"])


def read_rows(path: Path) -> list[dict]:
    """Rows of a results.jsonl; ValueError naming the file and line for a corrupt line."""
    rows = []
    if not path.exists():
        return rows
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e})") from None
    return rows


def merge_rows(*groups: list[dict]) -> list[dict]:
    """Union of row lists; for equal keys the later group wins. Order: first appearance."""
    merged: dict[tuple, dict] = {}
    for rows in groups:
        for r in rows:
            merged[row_key(r)] = r
    return list(merged.values())


def write_rows(path: Path, rows: list[dict]) -> None:
    """Write all rows (atomically: a temp file renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    tmp.replace(path)


# ----------------------------------------------------------------------------- verdicts
def verdict(case_rows: list[dict]) -> dict:
    """Compare hearth's time with the fastest correct fused peer (torch.compile, Liger, vendor).

    Returns {"verdict": win|loss|none, "ratio": peer_ms / hearth_ms or None, "peer": name or None,
    "text": e.g. "loss 0.87x vs liger"}. ratio > 1 means hearth is faster. Wrong or failed rows are
    never ranked. With no fused peer, eager is the comparison and the text says so."""
    by = {r["provider"]: r for r in case_rows}
    h = by.get("hearth")
    if h is None or h["status"] != "ok":
        status = h["status"] if h else "not run"
        return {"verdict": "none", "ratio": None, "peer": None, "text": f"hearth {status}"}
    peers = [r for r in case_rows if r["provider"] in FUSED_PEERS and r["status"] == "ok"]
    suffix = ""
    if not peers:
        peers = [r for r in case_rows if r["provider"] == "eager" and r["status"] == "ok"]
        suffix = " (no fused peer ran)"
    if not peers:
        return {"verdict": "none", "ratio": None, "peer": None, "text": "no peer ran"}
    best = min(peers, key=lambda r: r["ms"])
    ratio = best["ms"] / h["ms"]
    word = "win" if ratio >= 1.0 else "loss"
    return {"verdict": word, "ratio": ratio, "peer": best["provider"], "text": f"{word} {ratio:.3g}x vs {best['provider']}{suffix}"}


def group_cases(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[case_key(r)].append(r)
    return groups


# ----------------------------------------------------------------------------- Markdown
def _num(x, digits=3) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}g}" if abs(x) < 10**digits else f"{x:.0f}"


def cell(r: dict | None) -> str:
    """One provider's result in a table cell: 'ms [p20-p80], throughput (%SOL), +MiB' or the status."""
    if r is None:
        return ""
    if r["status"] != "ok":
        return f"**{r['status']}**"
    s = f"{_num(r['ms'])} ms [{_num(r['p20_ms'])}-{_num(r['p80_ms'])}], {_num(r['value'], 4)} {r['metric']}"
    if r.get("sol_pct") is not None:
        s += f" ({r['sol_pct']:.0f}%)"
    if r.get("extra_mib") is not None:
        s += f", +{_num(r['extra_mib'])} MiB"
        if r.get("grad_mib"):
            s += f" (act {_num(r['activation_mib'])})"
    return s


def _providers_in(rows) -> list[str]:
    present = {r["provider"] for r in rows}
    return [p for p in PROVIDERS if p in present]


def _sort_key(rows_of_case):
    r = rows_of_case[0]
    order = {"fwd": 0, "bwd": 1, "full": 2}
    return (r["dtype"], order.get(r["mode"], 3), r.get("work") or 0, r["size_label"])


def op_markdown(op: str, rows: list[dict]) -> str:
    """The Markdown page for one op: formula, method, one table, verdicts, and every non-ok reason."""
    rows = [r for r in rows if r["op"] == op]
    if not rows:
        return f"# {op}\n\nno results\n"
    first = rows[0]
    provs = _providers_in(rows)
    lines = [f"# {op}", "", f"Work counted: {first['formula']}. Metric: {first['metric']}; "
             "% = share of the limit measured in the same run (" + _limits_text(first.get("limits", {})) + ").", ""]
    if first.get("notes"):
        lines += [f"Note: {first['notes']}.", ""]
    lines += ["| case | dtype | mode | " + " | ".join(provs) + " | verdict |", "|" + "---|" * (len(provs) + 4)]
    problems = []
    for key, cr in sorted(group_cases(rows).items(), key=lambda kv: _sort_key(kv[1])):
        by = {r["provider"]: r for r in cr}
        v = verdict(cr)
        lines.append(f"| {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cell(by.get(p)) for p in provs) + f" | {v['text']} |")
        for p in provs:
            r = by.get(p)
            if r is not None and r["status"] != "ok":
                problems.append(f"- {key[1]} {key[2]} {key[3]}, {p}: **{r['status']}**: {r.get('reason', '')}")
    if problems:
        lines += ["", "## Not measured, and why", ""] + problems
    return "\n".join(lines) + "\n"


def _limits_text(limits: dict) -> str:
    if not limits:
        return "no limits measured"
    return (f"{_num(limits.get('copy_GBps'), 4)} GB/s from a {limits.get('copy_what')}; "
            f"{_num(limits.get('matmul_TFLOPs'), 4)} TFLOP/s from {limits.get('matmul_what')}")


def summary_markdown(rows: list[dict]) -> str:
    """summary.md: environment, the headline table, then every loss and every hearth failure."""
    if not rows:
        return "# hearth bench summary\n\nno results\n"
    envs = {json.dumps(r.get("env", {}), sort_keys=True) for r in rows}
    lines = ["# hearth bench summary", ""]
    for e in sorted(envs):
        env = json.loads(e)
        lines.append("- " + ", ".join(f"{k}: {env[k]}" for k in ("gpu", "driver", "torch", "triton", "liger", "date") if k in env))
    if any(str(json.loads(e).get("gpu", "")).startswith("CPU") for e in envs):
        lines += ["", "**CPU run under the Triton interpreter (--check): times validate the harness only; they say "
                  "nothing about kernel speed.**"]
    lines += ["", "Timing: CUDA events, median ms [p20-p80], warm-up excluded, L2 flushed between calls. Memory: extra = peak "
              "allocated during one call minus allocated before it (inputs and earlier .grad excluded; grads reset to None); "
              "act = extra minus the gradients the call produced. Verdict: hearth against the fastest correct fused peer "
              "(torch.compile, Liger, vendor); ratio = peer ms / hearth ms.", ""]
    groups = group_cases(rows)
    head = {k: v for k, v in groups.items() if any(r.get("headline") for r in v)}
    if head:
        provs = _providers_in([r for v in head.values() for r in v])
        lines += ["## Headline (the TARGETS.md shapes)", "",
                  "| op | case | dtype | mode | " + " | ".join(provs) + " | SOL floor | verdict |", "|" + "---|" * (len(provs) + 6)]
        for key, cr in sorted(head.items(), key=lambda kv: (kv[0][0], _sort_key(kv[1]))):
            by = {r["provider"]: r for r in cr}
            floor = _floor_ms(cr[0])
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cell(by.get(p)) for p in provs)
                         + f" | {_num(floor)} ms | {verdict(cr)['text']} |")
        lines.append("")
    losses, failures = [], []
    for key, cr in sorted(groups.items()):
        v = verdict(cr)
        by = {r["provider"]: r for r in cr}
        if v["verdict"] == "loss":
            peer = by[v["peer"]]
            losses.append(f"- {key[0]} {key[1]} {key[2]} {key[3]}: {v['text']} (hearth {_num(by['hearth']['ms'])} ms, "
                          f"{v['peer']} {_num(peer['ms'])} ms)")
        h = by.get("hearth")
        if h is not None and h["status"] != "ok":
            failures.append(f"- {key[0]} {key[1]} {key[2]} {key[3]}: hearth **{h['status']}**: {h.get('reason', '')}")
    lines += ["## Losses", ""] + (losses or ["none"]) + ["", "## hearth cases not measured", ""] + (failures or ["none"])
    wins = sum(verdict(cr)["verdict"] == "win" for cr in groups.values())
    lines += ["", f"{wins} wins, {len(losses)} losses, {len(failures)} hearth cases not measured, {len(groups)} cases in all."]
    return "\n".join(lines) + "\n"


def _floor_ms(r: dict) -> float | None:
    """Time at the speed-of-light limit measured in the same run: work / limit."""
    lim = r.get("limits", {})
    work = r.get("work")
    rate = lim.get("copy_GBps", 0) * 1e9 if r["metric"] == "GB/s" else lim.get("matmul_TFLOPs", 0) * 1e12
    return work / rate * 1e3 if work and rate else None


def write_reports(out: Path, rows: list[dict], plots: bool = True) -> list[Path]:
    """Write <op>.md per op, summary.md and (if plots) PNGs into `out`; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for op in sorted({r["op"] for r in rows}):
        p = out / f"{op}.md"
        p.write_text(op_markdown(op, rows))
        written.append(p)
    p = out / "summary.md"
    p.write_text(summary_markdown(rows))
    written.append(p)
    if plots:
        from hearth.bench.plots import write_plots

        written += write_plots(out, rows)
    return written
