"""PNG plots per op, dtype and mode: throughput vs size and peak extra memory vs size, one line
per provider. Only correct ("ok") results are drawn; sizes go left to right by the work they do. Each figure's foot
names the GPU, versions and command of the runs behind it."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from hearth.bench.providers import PROVIDERS
from hearth.durable import write_file


def plot_series(rows: list[dict]) -> dict[str, list[dict]]:
    """The lines of one plot: {label: rows}, one per provider in PROVIDERS order; where the rows hold more than one
    input layout (report.row_layout: a merge of rows from before and after attention's inputs changed), one line per
    provider and layout, labelled "provider [layout]", so rows of different layouts never share a line. A peer's rows
    measured on another setup than hearth's at their case (report._setup: GPU, software, timing procedure; merged
    from another run) are a line of their own, labelled "(another setup: not ranked)", as verdict names them."""
    from hearth.bench.report import _setup, row_layout

    layouts = sorted({row_layout(r) for r in rows})
    hearth_at = {r.get("size_label"): r for r in rows if r["provider"] == "hearth"}

    def apart(r) -> bool:
        """A peer row measured on another GPU, software or timing procedure than hearth's row of its case (merged
        from another run): verdict does not rank it against hearth, so it is not drawn as one line with the ranked."""
        h = hearth_at.get(r.get("size_label"))
        return r["provider"] != "hearth" and h is not None and _setup(r)[:-1] != _setup(h)[:-1]  # layout: above

    series: dict[str, list[dict]] = {}
    for prov in [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]:
        for layout in layouts:
            for other in (False, True):
                mine = [r for r in rows if r["provider"] == prov and row_layout(r) == layout and apart(r) == other]
                if mine:
                    name = prov if len(layouts) == 1 else f"{prov} [{layout}]"
                    series[name + (" (another setup: not ranked)" if other else "")] = mine
    return series


def _save(fig, path: Path) -> None:
    """The figure as a PNG at `path`, whole or not at all (saved under a temporary name beside it, then renamed: a run
    cut mid-save left a torn PNG); the figure is closed either way."""
    try:
        write_file(path, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


FOOTER_LINE_IN = 0.14  # inches of figure height per footer line


def _footer(fig, rows: list[dict]) -> None:
    """The GPU, versions and command lines of the runs behind the figure's rows (report.run_provenance) at its foot,
    below the axes: a PNG read on its own says where its numbers come from."""
    import textwrap

    from hearth.bench.report import run_provenance

    w, h = fig.get_size_inches()
    width = max(40, int(w * 72 / 4.6))  # characters of 6 pt monospace across the figure, with a margin
    lines = [part for line in run_provenance(rows)
             for part in textwrap.wrap(line, width, subsequent_indent="    ", break_on_hyphens=False)]
    extra = FOOTER_LINE_IN * (len(lines) + 0.5)
    fig.set_size_inches(w, h + extra)
    fig.text(0.01, 0.005, "\n".join(lines), ha="left", va="bottom", fontsize=6, family="monospace")
    fig.tight_layout(rect=(0, extra / (h + extra), 1, 1))


def write_plots(out: Path, rows: list[dict]) -> list[Path]:
    """One PNG per (op, dtype, mode) with at least one ok row; returns the paths written. The PNG of a group whose
    rows are all not ok is removed (an earlier report's)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok":
            groups[(r["op"], r["dtype"], r["mode"])].append(r)
    # a group with rows but none ok draws nothing: an earlier report's PNG of it (curves results.jsonl no longer
    # holds, e.g. every provider failed in the rerun) is removed, not left beside pages that say otherwise
    for op, dtype, mode in {(r["op"], r["dtype"], r["mode"]) for r in rows} - set(groups):
        (out / f"{op}_{mode}_{dtype}.png").unlink(missing_ok=True)
    paths = []
    for (op, dtype, mode), rs in sorted(groups.items()):
        # one tick per case, placed by its work; rows of one case may count different work (merged from runs
        # before and after a formula changed): the case's largest count places it
        work: dict[str, float] = {}
        for r in rs:
            work[r["size_label"]] = max(work.get(r["size_label"], 0), r.get("work") or 0)
        labels = sorted(work, key=lambda lab: (work[lab], lab))
        xs = {lab: i for i, lab in enumerate(labels)}
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        have_mem = False
        for name, mine in plot_series(rs).items():
            pr = sorted(mine, key=lambda r: xs[r["size_label"]])
            style = dict(marker="o", linewidth=2.5 if pr[0]["provider"] == "hearth" else 1.2, label=name,
                         linestyle="--" if name.endswith("not ranked)") else "-")
            ax1.plot([xs[r["size_label"]] for r in pr], [r["value"] for r in pr], **style)
            mem = [r for r in pr if r.get("extra_mib") is not None]
            if mem:
                have_mem = True
                ax2.plot([xs[r["size_label"]] for r in mem], [r["extra_mib"] for r in mem], **style)
        metric = rs[0]["metric"]
        ax1.set_title(f"{op} {mode} {dtype}: {metric}")
        ax1.set_ylabel(metric)
        ax2.set_title(f"{op} {mode} {dtype}: peak extra memory")
        ax2.set_ylabel("MiB (peak during call - allocated before)")
        if have_mem:
            # eager can hold 100x what a fused kernel holds: a log scale keeps both readable
            ax2.set_yscale("symlog", linthresh=1.0)
        else:
            ax2.text(0.5, 0.5, "not measured (no CUDA)", ha="center", va="center", transform=ax2.transAxes)
        for ax in (ax1, ax2):
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        _footer(fig, rs)
        p = out / f"{op}_{mode}_{dtype}.png"
        _save(fig, p)
        paths.append(p)
    return paths


def write_ratio_plot(out: Path, rows: list[dict]) -> Path | None:
    """ratios.png: per op, every ranked case's ratio (fastest correct fused peer ms / hearth ms,
    > 1 = hearth faster) as a dot, the op's geometric mean as a bar, and the 0.95 / 1.0 / 1.10
    lines the goals name. None when no case was ranked (and an earlier ratios.png in `out` is removed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hearth.bench.report import RATIO_MARKS, op_geomeans, shown

    g = {op: v for op, v in op_geomeans(rows).items() if v["ratios"]}
    if not g:
        # no case ranked (hearth wrong everywhere after a rerun, say): an earlier report's ratios.png, hearth's old
        # ratios, is removed, not left beside a summary whose GEOMEAN lines rank nothing
        (out / "ratios.png").unlink(missing_ok=True)
        return None
    ops = list(g)
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(ops) + 1.6))
    for i, op in enumerate(ops):
        rs = [r for r, _, _ in g[op]["ratios"]]
        n = len(rs)
        ys = [i + (j - (n - 1) / 2) * min(0.08, 0.6 / max(n, 1)) for j in range(n)]
        ax.scatter(rs, ys, s=22, color="tab:blue", zorder=3)
        ax.plot([g[op]["geomean"]] * 2, [i - 0.35, i + 0.35], color="tab:red", linewidth=2.5, zorder=4)
    for x, style in ((0.95, ":"), (1.0, "-"), (1.10, "--")):
        ax.axvline(x, color="grey", linestyle=style, linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(ops)))
    # the geomean with the digits that keep it on its side of the 0.95 / 1.0 / 1.10 lines (report.shown)
    ax.set_yticklabels([f"{op} ({shown(g[op]['geomean'], 2, RATIO_MARKS, 'f')}x)" for op in ops], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("fastest correct fused peer ms / hearth ms (dots: cases; red: geomean; lines 0.95, 1.0, 1.10)")
    ax.grid(alpha=0.3, axis="x")
    # the rows of the cases drawn (hearth's and their peers')
    _footer(fig, [r for r in rows if r["op"] in g])
    p = out / "ratios.png"
    _save(fig, p)
    return p
