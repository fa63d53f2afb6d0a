"""Results on disk: results.jsonl (one row per case x provider), a Markdown table per op with a
verdict per case, summary.md (headline table first, then every loss), and PNG plots (plots.py).

Rows are merged by key (op, size, dtype, mode, provider): the row of a later run replaces an earlier one,
so ops run across several calls (or machines' folders, --merge) end up in one report -- except that a
"skipped" row (not measured in its run: out of time budget, a sticky CUDA error) never replaces a measured
row: the earlier measurement stands, with its own run's date, versions and command on it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from hearth.bench.cases import SPECS
from hearth.bench.providers import FUSED_PEERS, PROVIDERS, applies
from hearth.bench.timing import TIMING_METHOD
from hearth.durable import write_text

STATUSES = ("ok", "wrong", "error", "oom", "refuses", "unavailable", "skipped")


def row_key(r: dict) -> tuple:
    return (r["op"], r["size_label"], r["dtype"], r["mode"], r["provider"])


def case_key(r: dict) -> tuple:
    return (r["op"], r["size_label"], r["dtype"], r["mode"])


# the fields every row has (row_key, the verdicts and tables read them unguarded)
ROW_FIELDS = ("op", "size_label", "dtype", "mode", "provider", "status")


def read_rows(path: Path) -> list[dict]:
    """Rows of a results.jsonl; ValueError naming the file and line for a corrupt line, or one that is not a bench
    row (not an object, or without a ROW_FIELDS field: another tool's results.jsonl)."""
    rows = []
    if not path.exists():
        return rows
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:  # a ValueError naming no file: "'utf-8' codec can't decode byte 0xff ..."
        raise ValueError(f"{path}: not a results file (not UTF-8 text: byte {e.start})") from None
    except OSError as e:  # no read permission, a device, ...: a traceback before
        raise ValueError(f"{path}: cannot read it ({type(e).__name__}: {e.strerror or e})") from None
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{i}: not a bench row (a JSON {type(row).__name__}, not an object)")
            missing = [k for k in ROW_FIELDS if k not in row]
            if missing:
                raise ValueError(f"{path}:{i}: not a bench row (no {', '.join(missing)})")
            rows.append(row)
    return rows


# statuses that say a run did not measure the row: merged over a row that was measured, they do not replace it
NOT_RUN = ("skipped", "unavailable")


def _not_run(r: dict) -> bool:
    """Whether a row says its run did not measure it (NOT_RUN). hearth's own 'unavailable' is not such a row: it says
    hearth.kernels.<op> does not import, hearth's failure (op_geomeans counts it as a hearth case not ok)."""
    return r.get("status") in NOT_RUN and not (r.get("status") == "unavailable" and r.get("provider") == "hearth")


def _replaces(new: dict, old: dict | None) -> bool:
    """Whether `new` takes the place of `old` (same key) in a merge: a measured row beats one not run; else the row of
    the later run (env.date) wins, and of one run (or without dates) the row merged later."""
    if old is None:
        return True
    if _not_run(new) != _not_run(old):
        return _not_run(old)
    d_new, d_old = (new.get("env") or {}).get("date"), (old.get("env") or {}).get("date")
    return not (d_new and d_old and d_new < d_old)


def _never_applies(r: dict) -> bool:
    """A row of a provider that can never run its op (providers.applies: Liger on attention, cuBLAS on rms_norm),
    written as 'skipped' by runs before the time-budget path left them out: no later run replaces it."""
    return r.get("op") in SPECS and r.get("provider") in PROVIDERS and not applies(r["op"], r["provider"])


def merge_rows(*groups: list[dict]) -> list[dict]:
    """Union of row lists; for equal keys the row of the later run (env.date; of one run, or undated, the later
    group) wins, but a row that was not run (NOT_RUN: skipped, or a peer unavailable in that run) never replaces one
    that was (a rerun that ran out of budget, or a device call that did not carry a peer's wheel, would otherwise
    erase the measurement), and an older folder merged last does not put its rows back over newer ones. Rows of a
    provider that never applies to their op are dropped (_never_applies). Order: first appearance."""
    merged: dict[tuple, dict] = {}
    for rows in groups:
        for r in rows:
            if _never_applies(r):
                continue
            key = row_key(r)
            if _replaces(r, merged.get(key)):
                merged[key] = r
    return list(merged.values())


def write_rows(path: Path, rows: list[dict]) -> None:
    """Write all rows, whole or not at all (durable.write_text: a temp file beside it, flushed, renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


# ----------------------------------------------------------------------------- verdicts
# what a row's time depends on besides the code: rows merged from other runs (--merge, a rerun of some
# providers) are compared with hearth only when measured on the same GPU and software, by the same timing procedure
SETUP_KEYS = ("gpu", "driver", "torch", "triton")

# the timing procedures before rows named theirs (env "timing"): (the UTC time of the commit that ended it, it)
TIMING_BEFORE = (
    ("2026-12-04T05:34:08Z", "sleep ~1 ms, wall 1 block"),  # dc843cb: the sleep sized by the call's host time
    ("2026-12-04T08:54:39Z", "sleep by host time, wall 1 block"),  # e3baf84: wall the median of 5 blocks
    ("2026-12-04T15:55:32Z", "sleep by host time, wall median of 5 blocks"),  # 1b662d2: the sleep >= one call
)


def timing_method(r: dict) -> str | None:
    """The timing procedure a row was measured with: its env's "timing", or for a row written before env carried it,
    the procedure of its run's date (TIMING_BEFORE; after the last change, today's TIMING_METHOD); None without
    either."""
    env = r.get("env") or {}
    if env.get("timing"):
        return env["timing"]
    date = env.get("date")
    if not date:
        return None
    return next((method for until, method in TIMING_BEFORE if date < until), TIMING_METHOD)


def row_layout(r: dict) -> str:
    """The memory layout of a row's inputs (cases.LAYOUTS): its "layout" field, written since review 50; before it,
    rope's rows said the Hugging Face layout in their notes (review 49b) and every other row, attention's included,
    was measured on contiguous inputs."""
    if r.get("layout"):
        return r["layout"]
    return "hf" if "Hugging Face layout" in (r.get("notes") or "") else "contiguous"


def _setup(r: dict) -> tuple:
    env = r.get("env") or {}
    return tuple(env.get(k) for k in SETUP_KEYS) + (timing_method(r), row_layout(r))


def _rankable(r: dict, h: dict) -> bool:
    """An ok fused-peer row measured on hearth's setup (GPU, software and timing procedure) and inputs' layout."""
    return r["provider"] in FUSED_PEERS and r["status"] == "ok" and _setup(r) == _setup(h)


def _why_unranked(r: dict, h: dict) -> str:
    """How an ok peer row that is not rankable against hearth's differs: its inputs' layout, else its setup."""
    return "in another input layout" if row_layout(r) != row_layout(h) else "on another setup"


def verdict(case_rows: list[dict]) -> dict:
    """Compare hearth's time with the fastest correct fused peer (torch.compile, Liger, vendor).

    Returns {"verdict": win|loss|none, "ratio": peer_ms / hearth_ms or None, "peer": name or None,
    "text": e.g. "loss 0.87x vs liger", "unranked": ["compile error", ...], "within_noise": whether the two
    rows' p20-p80 ranges overlap (then the text says so)}. ratio > 1 means hearth is
    faster. Wrong or failed rows are never ranked, and never silently: every fused peer whose row is not ok
    is named in "unranked" and in the text (the ratio is then against the peers that did run), and so is
    a peer row measured on another GPU or software setup than hearth's, by another timing procedure
    (SETUP_KEYS, timing_method: merged from another run), or on inputs of another memory layout (row_layout:
    attention's rows before and after review 50). With no fused peer, eager is the comparison and the text says so."""
    by = {r["provider"]: r for r in case_rows}
    h = by.get("hearth")
    unranked = [f"{r['provider']} {r['status']}" for r in case_rows if r["provider"] in FUSED_PEERS and r["status"] != "ok"]
    if h is None or h["status"] != "ok":
        status = h["status"] if h else "not run"
        return {"verdict": "none", "ratio": None, "peer": None, "text": f"hearth {status}", "unranked": unranked}
    unranked += [f"{r['provider']} {_why_unranked(r, h)}" for r in case_rows
                 if r["provider"] in FUSED_PEERS and r["status"] == "ok" and not _rankable(r, h)]
    peers = [r for r in case_rows if _rankable(r, h)]
    suffix = f" (not ranked: {', '.join(unranked)})" if unranked else ""
    if not peers:
        peers = [r for r in case_rows if r["provider"] == "eager" and r["status"] == "ok" and _setup(r) == _setup(h)]
        suffix = " (no fused peer ran" + (f": {', '.join(unranked)})" if unranked else ")")
    if not peers:  # fused peers that ran but are not ranked are named, not read as 'no peer ran'
        text = f"no peer ran correctly (not ranked: {', '.join(unranked)})" if unranked else "no peer ran"
        return {"verdict": "none", "ratio": None, "peer": None, "text": text, "unranked": unranked}
    best = min(peers, key=lambda r: r["ms"])
    ratio = best["ms"] / h["ms"]
    word = "win" if ratio >= 1.0 else "loss"
    # a win or loss whose p20-p80 spreads overlap is stated as such: the sign of a 1.001x is noise, and the
    # verdict word stays (a loss is never turned into a tie that the losses table would drop)
    noise = _within_noise(h, best)
    return {"verdict": word, "ratio": ratio, "peer": best["provider"], "unranked": unranked, "within_noise": noise,
            "text": f"{word} {shown(ratio, 3, RATIO_MARKS)}x vs {best['provider']}{' (within noise: p20-p80 overlap)' if noise else ''}{suffix}"}


def _fastest_wall(case_rows: list[dict], h: dict) -> dict | None:
    """The rankable fused peer with the least wall time per call (None: no such row)."""
    walls = [r for r in case_rows if _rankable(r, h) and r.get("wall_ms")]
    return min(walls, key=lambda r: r["wall_ms"]) if walls else None


def _within_noise(a: dict, b: dict) -> bool:
    """True when the two rows' [p20, p80] time ranges overlap (False when either lacks them)."""
    try:
        return float(a["p20_ms"]) <= float(b["p80_ms"]) and float(b["p20_ms"]) <= float(a["p80_ms"])
    except (KeyError, TypeError, ValueError):
        return False


def group_cases(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[case_key(r)].append(r)
    return groups


# ----------------------------------------------------------------------------- byte counts
# earlier byte counts of the very same calls, by the op they counted (b88d4b7, 2026-12-04: a fwd+bwd case's bytes became
# the forward's plus the backward's, swiglu 8 passes of M x I (was 6), the norms 5 of M x N (was 4); the calls timed did
# not change). Rows keep the count they were measured with, so a merge can hold both in one case: GB/s is bytes / the
# row's own ms, so such a row is recounted with the op's current formula from its time (recount), and all rows of a
# case read on one count. A count not named here may also have timed other calls: rows under it are not recounted, and
# a case whose rows still differ is marked not comparable (bandwidth_mixed).
RECOUNTED = {
    "bytes: fwd 3*M*I*b; bwd 5*M*I*b; full 6*M*I*b (read g, u, dh; write h, dg, du)": "swiglu",
    "bytes: fwd 2*M*N*b; bwd 3*M*N*b; full 4*M*N*b (read x, dy; write y, dx); + 2*N*b for the weight": "rms_norm",
    "bytes: fwd 2*M*N*b; bwd 3*M*N*b; full 4*M*N*b; + 2*N*b for weight and bias": "layer_norm",
}


def recount(r: dict) -> dict:
    """The row, or where it was counted by an earlier formula of its op (RECOUNTED) a copy with the op's current
    formula, work, value (GB/s) and sol_pct from its own ms, and "recounted_from": the formula it was measured with.
    The row itself is left as measured."""
    spec = SPECS.get(r.get("op"))
    old = r.get("formula")
    if spec is None or old == spec.formula or RECOUNTED.get(old) != r["op"] or not isinstance(r.get("size"), dict):
        return r
    from hearth.bench.runner import _itemsize
    from hearth.bench.timing import sol_percent, throughput

    out = {**r, "formula": spec.formula, "recounted_from": old,
           "work": spec.work(r["size"], _itemsize(r["dtype"]), r["mode"])}
    if r.get("status") == "ok" and r.get("ms"):
        out["value"] = throughput(out["work"], r["ms"], spec.metric)
        out["sol_pct"] = sol_percent(out["value"], spec.metric, r.get("limits") or {})
    return out


def recount_rows(rows: list[dict]) -> list[dict]:
    return [recount(r) for r in rows]


def bandwidth_mixed(case_rows: list[dict]) -> dict[str, str]:
    """{provider: formula} of a case's ok GB/s rows when they (recounted) count bytes by more than one formula: their
    GB/s and % are not comparable; {} when they agree."""
    by = {r["provider"]: r.get("formula") or "?" for r in recount_rows(case_rows)
          if r.get("status") == "ok" and r.get("metric") == "GB/s"}
    return by if len(set(by.values())) > 1 else {}


# ----------------------------------------------------------------------------- Markdown
def shown(x: float, digits: int, marks=(), kind: str = "g") -> str:
    """x as `{x:.<digits><kind>}`, with as many more digits as it takes to sit on the same side of every mark (a goal's
    threshold, 1.0 between a win and a loss) as x itself: a 1.0964x ratio reads 1.096, not 1.1 beside a 1.10x goal it
    misses, and a 0.9996x loss reads 0.9996, not 1."""
    for d in range(digits, digits + 12):
        s = f"{x:.{d}{kind}}"
        if all((float(s) >= m) == (x >= m) for m in marks):
            return s
    return repr(x)


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
        s += f" ({shown(r['sol_pct'], 0, (GOAL_SOL_PCT,), 'f')}%)"
    if r.get("extra_mib") is not None:
        s += f", +{_num(r['extra_mib'])} MiB"
        if r.get("grad_mib"):
            s += f" (act {_num(r['activation_mib'])})"
    if r.get("wall_ms") is not None:
        s += f"; wall {_num(r['wall_ms'])} ms/call"
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
    rows = recount_rows([r for r in rows if r["op"] == op])
    if not rows:
        return f"# {op}\n\nno results\n"
    first = rows[0]
    provs = _providers_in(rows)
    formula = SPECS[op].formula if op in SPECS else first["formula"]
    lines = [f"# {op}", "", "Measured by (GPU, versions, date, command of each run whose rows are here):", ""]
    lines += env_lines(rows) + ["", f"Work counted: {formula}. Metric: {first['metric']}; "
                                "% = share of the limit measured in the same run (" + _limits_text(first.get("limits", {})) + ").", ""]
    recounted = sorted({r["recounted_from"] for r in rows if r.get("recounted_from")})
    if recounted:
        n = sum(1 for r in rows if r.get("recounted_from"))
        lines += [f"{n} row(s) measured under an earlier byte count of the same calls ({'; '.join(recounted)}) are "
                  "recounted with this one from their own time: their GB/s and % here are not the ones they were "
                  "written with.", ""]
    if first.get("notes"):
        lines += [f"Note: {first['notes']}.", ""]
    lines += ["| case | dtype | mode | " + " | ".join(provs) + " | verdict |", "|" + "---|" * (len(provs) + 4)]
    problems, mixed = [], []
    for key, cr in sorted(group_cases(rows).items(), key=lambda kv: _sort_key(kv[1])):
        by = {r["provider"]: r for r in cr}
        v = verdict(cr)
        text = v["text"]
        if m := bandwidth_mixed(cr):
            text += "; **GB/s not comparable** (byte formulas differ: below)"
            mixed.append(f"- {key[1]} {key[2]} {key[3]}: " + "; ".join(f"{p}: {f}" for p, f in m.items()))
        lines.append(f"| {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cell(by.get(p)) for p in provs) + f" | {text} |")
        for p in provs:
            r = by.get(p)
            if r is not None and r["status"] != "ok":
                problems.append(f"- {key[1]} {key[2]} {key[3]}, {p}: **{r['status']}**: {r.get('reason', '')}")
    if mixed:
        lines += ["", "## GB/s not comparable: rows of one case counted bytes by different formulas", "",
                  "The times compare (the verdict); the GB/s and % of these rows do not, and no recount is known "
                  "between their formulas (report.RECOUNTED).", ""] + mixed
    if problems:
        lines += ["", "## Not measured, and why", ""] + problems
    return "\n".join(lines) + "\n"


def _limits_text(limits: dict) -> str:
    if not limits:
        return "no limits measured"
    return (f"{_num(limits.get('copy_GBps'), 4)} GB/s from a {limits.get('copy_what')}; "
            f"{_num(limits.get('matmul_TFLOPs'), 4)} TFLOP/s from {limits.get('matmul_what')}")


# what a page or plot says about the runs its figures come from (every row's env carries them)
ENV_KEYS = ("gpu", "driver", "torch", "triton", "liger", "quack", "flash_attn", "date")
VERSION_KEYS = ("driver", "torch", "triton", "liger", "quack", "flash_attn")


def env_lines(rows: list[dict]) -> list[str]:
    """One Markdown bullet per run (distinct env) among `rows`: GPU, driver, versions, date and the command line."""
    envs = {json.dumps(r.get("env") or {}, sort_keys=True) for r in rows}
    lines = []
    for e in sorted(envs):
        env = json.loads(e)
        line = "- " + ", ".join(f"{k}: {env[k]}" for k in ENV_KEYS if k in env)
        if env.get("command"):
            line += f"; command: `{env['command']}`"
        lines.append(line)
    return lines


def run_provenance(rows: list[dict]) -> list[str]:
    """Plain-text lines naming the GPUs with their software versions, then the commands, of the runs behind `rows`
    (the plots' footer)."""
    setups, commands = {}, {}
    for r in rows:
        env = r.get("env") or {}
        parts = [str(env.get("gpu") or "unknown GPU")]
        parts += [f"{k} {env[k]}" for k in VERSION_KEYS if env.get(k) is not None]
        setups[", ".join(parts)] = None
        if env.get("command"):
            commands[f"command: {env['command']}"] = None
    return list(setups) + list(commands)


def summary_markdown(rows: list[dict]) -> str:
    """summary.md: environment, the headline table, then every loss and every hearth failure."""
    if not rows:
        return "# hearth bench summary\n\nno results\n"
    rows = recount_rows(rows)
    envs = {json.dumps(r.get("env", {}), sort_keys=True) for r in rows}
    lines = ["# hearth bench summary", ""] + env_lines(rows)
    if any(str(json.loads(e).get("gpu", "")).startswith("CPU") for e in envs):
        lines += ["", "**CPU run under the Triton interpreter (--check): times validate the harness only; they say "
                  "nothing about kernel speed.**"]
    lines += ["", "Timing: CUDA events, median ms [p20-p80], warm-up excluded, L2 flushed between calls, a device sleep "
              "queued before each call (since 2026-12-04 at least as long as the call: the GPU idles as long as it works, "
              "so the power limit leaves the clock alone; rows carry sleep_ms). Memory: extra = peak "
              "allocated during one call minus allocated before it (inputs and earlier .grad excluded; grads reset to None); "
              "act = extra minus the gradients the call produced. Verdict: hearth against the fastest correct fused peer "
              "(torch.compile, Liger, quack, vendor) measured on the same GPU and software by the same timing procedure; ratio = "
              "peer ms / hearth ms; a peer not ranked (not ok, or merged from another setup or input layout) is named beside the verdict. wall = ms per call back to back "
              "(no device sleep, no L2 flush; the median of 5 blocks of calls since 2026-12-04, one block before): the host "
              "overhead a training loop sees.", ""]
    groups = group_cases(rows)
    head = {k: v for k, v in groups.items() if any(r.get("headline") for r in v)}
    if head:
        provs = _providers_in([r for v in head.values() for r in v])
        lines += ["## Headline (the published target shapes)", "",
                  "| op | case | dtype | mode | " + " | ".join(provs) + " | SOL floor | verdict |", "|" + "---|" * (len(provs) + 6)]
        for key, cr in sorted(head.items(), key=lambda kv: (kv[0][0], _sort_key(kv[1]))):
            by = {r["provider"]: r for r in cr}
            # the floor of hearth's row (its run's work count and copy / matmul limit), which it is read against; the
            # case's first row may be a peer's from another run or GPU merged in before hearth's
            floor = _floor_ms(by["hearth"]) if "hearth" in by else None
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cell(by.get(p)) for p in provs)
                         + f" | {_num(floor)} ms | {verdict(cr)['text']} |")
        lines.append("")
    lines += ["## Per op: geometric mean against the fastest correct fused peer", "", "```"] + geomean_lines(rows) + ["```", ""]
    goal = attention_goal_lines(rows)
    if goal:
        lines += ["## Attention against cuDNN and FlashAttention (the flash-attention goals)", "", "```"] + goal + ["```", ""]
    lines += cases_markdown(rows)
    losses, failures = [], []
    for key, cr in sorted(groups.items()):
        v = verdict(cr)
        by = {r["provider"]: r for r in cr}
        if v["verdict"] == "loss":
            peer = by[v["peer"]]
            losses.append(f"- {key[0]} {key[1]} {key[2]} {key[3]}: {v['text']} (hearth {_num(by['hearth']['ms'])} ms, "
                          f"{v['peer']} {_num(peer['ms'])} ms)")
        h = by.get("hearth")
        if h is None:  # only peers' rows of the case (a peers-only run or merge)
            failures.append(f"- {key[0]} {key[1]} {key[2]} {key[3]}: no hearth row")
        elif h["status"] != "ok":
            failures.append(f"- {key[0]} {key[1]} {key[2]} {key[3]}: hearth **{h['status']}**: {h.get('reason', '')}")
    lines += ["## Losses", ""] + (losses or ["none"]) + ["", "## hearth cases not measured", ""] + (failures or ["none"])
    wins = sum(verdict(cr)["verdict"] == "win" for cr in groups.values())
    lines += ["", f"{wins} wins, {len(losses)} losses, {len(failures)} hearth cases not measured, {len(groups)} cases in all."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- per-op geomean
# issue 17's goals on the model-shape suite, per op
GOAL_GEOMEAN, GOAL_WORST, GOAL_SOL_PCT = 1.10, 0.95, 90.0
LARGE_BYTES = 1e9  # a memory-bound case moving at least this much is "large" for the bandwidth goal
# the marks a ratio (peer ms / hearth ms) is read against: a printed ratio keeps its side of each (shown)
RATIO_MARKS = (GOAL_WORST, 1.0, GOAL_GEOMEAN)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _case_name(key: tuple) -> str:
    """'<case> <mode>' (and the dtype when it is not bf16) for the worst-case mentions."""
    _, label, dtype, mode = key
    return f"{label} {mode}" + ("" if dtype == "bfloat16" else f" {dtype}")


def op_geomeans(rows: list[dict]) -> dict[str, dict]:
    """Per op, over its cases where hearth and at least one fused peer ran correctly:
    ratio = fastest correct fused peer's GPU ms / hearth's (> 1: hearth faster), its geometric
    mean and worst case; memory = hearth's extra MiB against that same peer's (count of cases
    where hearth holds no more, and the case where it holds the most over the peer); wall =
    the fused peers' best wall ms per call / hearth's (host overhead, back to back); sol = hearth's % of the copy
    bandwidth at every case of >= LARGE_BYTES where hearth ran correctly, a fused peer or not.
    Cases with no fused peer (eager only), where hearth failed, or where hearth's row was skipped (not run: time
    budget, a sticky CUDA error; "hearth_skipped") or that hold no hearth row at all (only peers were run or merged there;
    "hearth_absent") are counted, not ranked; ranked cases where
    a fused peer's row was not ok (wrong, error, oom, skipped...: ranked against the others) are counted too."""
    out: dict[str, dict] = {}
    for key, cr in sorted(group_cases(recount_rows(rows)).items()):
        op = key[0]
        g = out.setdefault(op, {"ratios": [], "mem": [], "walls": [], "sol": [], "no_peer": 0, "hearth_failed": 0, "cases": 0,
                                  "hearth_skipped": 0, "hearth_absent": 0, "peer_not_ok": 0, "unranked": [], "no_peer_why": [], "bw_mixed": [], "sol_formulas": set()})
        g["cases"] += 1
        if bandwidth_mixed(cr):
            g["bw_mixed"].append(key)
        by = {r["provider"]: r for r in cr}
        h = by.get("hearth")
        if h is None or h["status"] != "ok":
            # a hearth row the run did not measure (time budget, a sticky CUDA error, too large) is no failure of
            # hearth's, but the case is named as not run, never left out of the line without a word
            if h is None:  # only peers' rows (a peers-only run or merge): named, as a case hearth did not run
                g["hearth_absent"] += 1
            elif h["status"] == "skipped":
                g["hearth_skipped"] += 1
            else:
                g["hearth_failed"] += 1
            continue
        # the copy-bandwidth goal is hearth's own row at every large case, whether or not a fused peer ran there
        if h.get("metric") == "GB/s" and h.get("sol_pct") is not None and (h.get("work") or 0) >= LARGE_BYTES:
            g["sol"].append((h["sol_pct"], key))
            g["sol_formulas"].add(h.get("formula"))
        v = verdict(cr)
        if v["peer"] is None or v["peer"] not in FUSED_PEERS:
            g["no_peer"] += 1
            g["no_peer_why"] += [u for u in v["unranked"] if u not in g["no_peer_why"]]
            continue
        g["ratios"].append((v["ratio"], key, v["peer"]))
        if v["unranked"]:
            g["peer_not_ok"] += 1
            g["unranked"] += [u for u in v["unranked"] if u not in g["unranked"]]
        peer = by[v["peer"]]
        if h.get("extra_mib") is not None and peer.get("extra_mib") is not None:
            g["mem"].append((h["extra_mib"] - peer["extra_mib"], h["extra_mib"], peer["extra_mib"], key, v["peer"]))
        best = _fastest_wall(cr, h)
        if h.get("wall_ms") and best is not None:
            g["walls"].append((best["wall_ms"] / h["wall_ms"], key, best["provider"]))
    for op, g in out.items():
        g["geomean"] = _geomean([r for r, _, _ in g["ratios"]]) if g["ratios"] else None
        g["worst"] = min(g["ratios"], key=lambda t: t[0]) if g["ratios"] else None
        g["wall_geomean"] = _geomean([r for r, _, _ in g["walls"]]) if g["walls"] else None
        g["wall_worst"] = min(g["walls"], key=lambda t: t[0]) if g["walls"] else None
        g["mem_ok"] = sum(1 for d, *_ in g["mem"] if d <= 0)
        g["mem_worst"] = max(g["mem"], key=lambda t: t[0]) if g["mem"] else None
        g["sol_worst"] = min(g["sol"], key=lambda t: t[0]) if g["sol"] else None
    return out


def goals_text(g: dict) -> str:
    """Issue 17's goals for one op, each met or missed: geomean >= 1.10x, no case below 0.95x,
    hearth's extra memory <= the peer's in every case, and (memory-bound ops) >= 90% of the
    copy bandwidth at every case of >= 1 GB of traffic; '?' where nothing was measured."""
    def yn(ok):
        return "?" if ok is None else ("met" if ok else "MISSED")

    parts = [f"geomean >= {GOAL_GEOMEAN:.2f}x {yn(None if g['geomean'] is None else g['geomean'] >= GOAL_GEOMEAN)}",
             f"worst >= {GOAL_WORST:.2f}x {yn(None if g['worst'] is None else g['worst'][0] >= GOAL_WORST)}",
             f"mem <= peer {yn(None if not g['mem'] else g['mem_ok'] == len(g['mem']))}"]
    if g["sol"]:
        # hearth's cases counted by different formulas: their percentages are not one scale, the goal is left open
        sol_ok = None if len(g.get("sol_formulas") or ()) > 1 else g["sol_worst"][0] >= GOAL_SOL_PCT
        parts.append(f">= {GOAL_SOL_PCT:.0f}% copy BW {yn(sol_ok)}")
    if g["hearth_failed"]:
        parts.append(f"{g['hearth_failed']} hearth case(s) not ok: MISSED")
    if g.get("hearth_skipped"):
        parts.append(f"{g['hearth_skipped']} hearth case(s) not run: goals cover the measured cases only")
    if g.get("hearth_absent"):
        parts.append(f"{g['hearth_absent']} case(s) without a hearth row: goals cover the measured cases only")
    return "goals: " + ", ".join(parts)


def geomean_lines(rows: list[dict]) -> list[str]:
    """One line per op: `GEOMEAN <op> <ratio> worst <ratio> (<case>)`, then memory and wall."""
    lines = []
    for op, g in op_geomeans(rows).items():
        if g["geomean"] is None:
            line = f"GEOMEAN {op} - worst - (no case with hearth and a fused peer both correct"
            line += f"; {g['cases']} cases, {g['hearth_failed']} hearth not ok, {g['no_peer']} without a fused peer"
            line += f": {', '.join(g['no_peer_why'])}" if g["no_peer_why"] else ""
            line += f", {g['hearth_skipped']} hearth not run (skipped)" if g["hearth_skipped"] else ""
            line += (f", {g['hearth_absent']} without a hearth row)" if g["hearth_absent"] else ")")
            lines.append(line)
            continue
        wr, wkey, wpeer = g["worst"]
        line = (f"GEOMEAN {op} {shown(g['geomean'], 3, RATIO_MARKS, 'f')}x worst {shown(wr, 3, RATIO_MARKS, 'f')}x "
                f"({_case_name(wkey)} vs {wpeer})")
        line += f" | {len(g['ratios'])} of {g['cases']} cases ranked"
        if g["hearth_failed"]:
            line += f", {g['hearth_failed']} hearth not ok"
        if g["hearth_skipped"]:
            line += f", {g['hearth_skipped']} hearth not run (skipped)"
        if g["hearth_absent"]:
            line += f", {g['hearth_absent']} without a hearth row"
        if g["no_peer"]:
            line += f", {g['no_peer']} without a fused peer" + (f" ({', '.join(g['no_peer_why'])})" if g["no_peer_why"] else "")
        if g["peer_not_ok"]:
            line += f", {g['peer_not_ok']} ranked while a fused peer was not ok ({', '.join(g['unranked'])})"
        if g["mem"]:
            d, hm, pm, mkey, mpeer = g["mem_worst"]
            line += f" | mem <= peer in {g['mem_ok']}/{len(g['mem'])}"
            if d > 0:
                line += f", worst +{hm:.4g} vs +{pm:.4g} MiB ({_case_name(mkey)} vs {mpeer})"
        if g["sol"]:
            sp, skey = g["sol_worst"]
            if len(g["sol_formulas"]) > 1:
                line += (f" | copy BW not comparable: hearth's {len(g['sol'])} cases >= 1 GB counted bytes by "
                         f"{len(g['sol_formulas'])} formulas (least {shown(sp, 0, (GOAL_SOL_PCT,), 'f')}%, "
                         f"{_case_name(skey)})")
            else:
                line += f" | copy BW >= {shown(sp, 0, (GOAL_SOL_PCT,), 'f')}% at cases >= 1 GB (worst {_case_name(skey)})"
        if g["bw_mixed"]:
            line += (f" | GB/s not comparable between providers at {len(g['bw_mixed'])} case(s), byte formulas differ "
                     f"({', '.join(_case_name(k) for k in g['bw_mixed'])})")
        if g["wall_geomean"] is not None:
            xr, xkey, xpeer = g["wall_worst"]
            line += (f" | wall/call {shown(g['wall_geomean'], 3, RATIO_MARKS, 'f')}x worst {shown(xr, 3, RATIO_MARKS, 'f')}x "
                     f"({_case_name(xkey)} vs {xpeer})")
        line += " | " + goals_text(g)
        lines.append(line)
    return lines


# issue 15's goals for attention: against cuDNN (SDPA's cuDNN backend) at every case, forward and fwd+bwd, first
# >= 1.0x, never below 0.95x; activation memory in fwd+bwd at least 2x below cuDNN's; then FlashAttention-4
ATTN_GOAL_RATIO, ATTN_FLOOR_RATIO, ATTN_ACT_FACTOR = 1.0, 0.95, 2.0
ATTN_PEERS = (("sdpa_cudnn", "cuDNN"), ("flash_attn", "FlashAttention"))


def attention_goal_lines(rows: list[dict]) -> list[str]:
    """One `ATTENTION-GOAL <mode>` line per mode of the dense attention op's cases (fwd, full), each against
    cuDNN and, where it ran correctly, FlashAttention: how many cases hearth is at least as fast, the worst
    ratio and its case, the goals met or missed; and for full (fwd+bwd), how many cases hold activation
    memory at least 2x below cuDNN's. Only cases where hearth and the peer both ran correctly count, a peer
    only as verdict ranks it (_rankable: measured on hearth's setup); a case where hearth's row is not ok is named
    and misses the goals (skipped: named as not run), as goals_text does; nothing is printed without attention
    rows."""
    by_mode: dict[str, dict] = {}
    for key, cr in sorted(group_cases(rows).items()):
        if key[0] != "attention":
            continue
        m = by_mode.setdefault(key[3], {p: [] for p, _ in ATTN_PEERS} | {"act": [], "cases": 0, "failed": [], "skipped": []})
        h = next((r for r in cr if r["provider"] == "hearth" and r.get("status") == "ok" and r.get("ms")), None)
        if h is None:
            # a case where hearth's row is not ok is named, never dropped without a word: the goal is every case
            mine = next((r for r in cr if r["provider"] == "hearth"), None)
            if mine is None:  # only peers' rows: a case hearth did not run
                m["skipped"].append(f"{_case_name(key)}: no hearth row")
            elif mine.get("status") == "skipped":
                m["skipped"].append(_case_name(key))
            else:
                m["failed"].append(f"{_case_name(key)} {mine.get('status')}")
            continue
        by = {r["provider"]: r for r in cr if r["provider"] != "hearth" and r.get("ms") and _rankable(r, h)}
        m["cases"] += 1
        for peer, _ in ATTN_PEERS:
            if peer in by:
                m[peer].append((by[peer]["ms"] / h["ms"], key))
        c = by.get("sdpa_cudnn")
        if key[3] == "full" and c and h.get("activation_mib") is not None and c.get("activation_mib") is not None:
            m["act"].append((c["activation_mib"] / max(h["activation_mib"], 1e-9), key))
    lines = []
    for mode in sorted(by_mode):
        m = by_mode[mode]
        parts = [f"ATTENTION-GOAL {mode}: {m['cases']} cases"]
        for peer, name in ATTN_PEERS:
            rs = m[peer]
            if not rs:
                parts.append(f"{name} not measured")
                continue
            worst = min(rs, key=lambda t: t[0])
            ok = sum(r >= ATTN_GOAL_RATIO for r, _ in rs)
            marks = (ATTN_FLOOR_RATIO, ATTN_GOAL_RATIO)
            part = (f"vs {name}: >= {ATTN_GOAL_RATIO:.2f}x at {ok}/{len(rs)}, worst {shown(worst[0], 3, marks, 'f')}x "
                    f"({_case_name(worst[1])}), geomean {shown(_geomean([r for r, _ in rs]), 3, marks, 'f')}x")
            if peer == "sdpa_cudnn":
                part += (f"; goals: >= {ATTN_GOAL_RATIO:.2f}x everywhere {'met' if ok == len(rs) else 'MISSED'}, "
                         f"none below {ATTN_FLOOR_RATIO:.2f}x {'met' if worst[0] >= ATTN_FLOOR_RATIO else 'MISSED'}")
            else:
                part += f"; goal >= {ATTN_GOAL_RATIO:.2f}x everywhere {'met' if ok == len(rs) else 'MISSED'}"
            parts.append(part)
        if m["act"]:
            worst = min(m["act"], key=lambda t: t[0])
            ok = sum(f >= ATTN_ACT_FACTOR for f, _ in m["act"])
            parts.append(f"activation >= {ATTN_ACT_FACTOR:.0f}x below cuDNN at {ok}/{len(m['act'])} (least "
                         f"{shown(worst[0], 2, (ATTN_ACT_FACTOR,), 'f')}x, {_case_name(worst[1])}) "
                         f"{'met' if ok == len(m['act']) else 'MISSED'}")
        if m["failed"]:
            parts.append(f"{len(m['failed'])} hearth case(s) not ok ({', '.join(m['failed'])}): MISSED")
        if m["skipped"]:
            parts.append(f"{len(m['skipped'])} hearth case(s) not run ({', '.join(m['skipped'])}): goals cover the "
                         "measured cases only")
        lines.append(" | ".join(parts))
    return lines


def cases_markdown(rows: list[dict]) -> list[str]:
    """'Every case' table: hearth against the fastest correct fused peer on GPU time, extra
    memory and wall time per call (host overhead) in one row per case."""
    groups = group_cases(rows)
    if not groups:
        return []
    lines = ["## Every case: GPU time, memory and wall time per call", "",
             "GPU = CUDA-event median with the host ahead of the GPU (device sleep, L2 flushed): the kernels at the full "
             "clock; wall = the call back to back, no sleep, no flush (what a training loop with a short GPU queue sees, "
             "at the clock sustained load gets); host = time spent inside the "
             "calls. peer = the fastest correct fused peer by GPU time; its memory is compared. wall ratio = the best "
             "fused peer wall / hearth wall.", "",
             "| op | case | mode | hearth GPU | peer GPU | ratio | hearth +MiB | peer +MiB | hearth wall (host) | best peer wall | wall ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, cr in sorted(groups.items(), key=lambda kv: (kv[0][0], _sort_key(kv[1]))):
        by = {r["provider"]: r for r in cr}
        h = by.get("hearth")
        mode = key[3] + ("" if key[2] == "bfloat16" else f" {key[2]}")
        if h is None or h["status"] != "ok":
            lines.append(f"| {key[0]} | {key[1]} | {mode} | **{h['status'] if h else 'not run'}** | | | | | | | |")
            continue
        v = verdict(cr)
        peer = by.get(v["peer"]) if v["peer"] in FUSED_PEERS else None
        best = _fastest_wall(cr, h)
        cells = [
            f"{_num(h['ms'])} ms",
            f"{_num(peer['ms'])} ms ({peer['provider']})" if peer else "-",
            f"{shown(v['ratio'], 3, RATIO_MARKS)}x" if peer else "-",
            _num(h.get("extra_mib")),
            _num(peer.get("extra_mib")) if peer else "-",
            f"{_num(h['wall_ms'])} ({_num(h.get('host_ms'))}) ms" if h.get("wall_ms") else "-",
            f"{_num(best['wall_ms'])} ms ({best['provider']})" if best else "-",
            f"{shown(best['wall_ms'] / h['wall_ms'], 3, RATIO_MARKS)}x" if best and h.get("wall_ms") else "-",
        ]
        lines.append(f"| {key[0]} | {key[1]} | {mode} | " + " | ".join(cells) + " |")
    return lines + [""]


def _floor_ms(r: dict) -> float | None:
    """Time at the speed-of-light limit measured in the same run: work / limit."""
    lim = r.get("limits") or {}
    work = r.get("work")
    rate = lim.get("copy_GBps", 0) * 1e9 if r["metric"] == "GB/s" else lim.get("matmul_TFLOPs", 0) * 1e12
    return work / rate * 1e3 if work and rate else None


def write_reports(out: Path, rows: list[dict], plots: bool = True) -> list[Path]:
    """Write <op>.md per op, summary.md and (if plots) PNGs into `out`; return the paths."""
    # each file whole or not at all (durable.write_text; plots.py saves its PNGs the same way): written in place, a
    # run cut mid-write (a kill, a full disk, the device's hard timeout) left a torn or empty summary.md beside a
    # complete results.jsonl
    out.mkdir(parents=True, exist_ok=True)
    rows = recount_rows(rows)  # the plots' GB/s on one count per op too
    written = []
    for op in sorted({r["op"] for r in rows}):
        p = out / f"{op}.md"
        write_text(p, op_markdown(op, rows))
        written.append(p)
    p = out / "summary.md"
    write_text(p, summary_markdown(rows))
    written.append(p)
    if plots:
        from hearth.bench.plots import write_plots, write_ratio_plot

        written += write_plots(out, rows)
        ratio_png = write_ratio_plot(out, rows)
        if ratio_png is not None:
            written.append(ratio_png)
    return written
