"""plots.write_plots placed sizes by (size_label, work) pairs: rows of one case whose work differs (merged from runs
before and after a byte formula changed: benchmarks/h200/models' rms_norm 'Qwen3-8B q_norm ...' full, quack's row
counting 4*M*N*b, the others 5*M*N*b) put the case's label on two ticks, one of them empty, and every point of that
case on the later tick, past sizes it should precede. One tick per case now, each point on its own case's tick."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hearth.bench import plots  # noqa: E402


def _row(provider, label, work, value):
    return {"op": "rms_norm", "dtype": "bfloat16", "mode": "full", "status": "ok", "provider": provider,
            "size_label": label, "work": work, "value": value, "metric": "GB/s", "extra_mib": None}


def test_one_tick_per_case_and_each_point_on_its_cases_tick(tmp_path, monkeypatch):
    rows = [_row("hearth", "small", 100, 1.0), _row("liger", "small", 80, 1.1),  # one case, two works
            _row("hearth", "mid", 90, 2.0), _row("liger", "mid", 90, 2.1),
            _row("hearth", "big", 500, 3.0), _row("liger", "big", 500, 3.1)]
    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    assert len(plots.write_plots(tmp_path, rows)) == 1
    ax = figs[0].axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert sorted(ticks) == ["big", "mid", "small"], ticks  # each case once
    for line in ax.get_lines():
        prov = line.get_label()
        for x, y in zip(line.get_xdata(), line.get_ydata()):
            case = next(r["size_label"] for r in rows if r["provider"] == prov and r["value"] == y)
            assert ticks[int(x)] == case, (prov, case, ticks)
