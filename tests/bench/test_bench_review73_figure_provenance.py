"""Review 73: every page and plot of the bench says which GPU, versions and command its figures come from.

results.jsonl carries GPU, driver, versions, date and command on every row, but the pages built from it did not pass
that on: summary.md listed GPU and versions without the command; an op's page (<op>.md, the per-case tables of ms,
GB/s and memory) named neither the GPU, the versions nor the command; and the PNG plots (throughput and memory per
case, ratios.png) only op, mode and dtype. A page or plot read on its own (linked from a README, packed into
reports.tgz) could not say what machine or command gave its numbers.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hearth.bench import plots, report  # noqa: E402

ENV = {"gpu": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0+cu130", "triton": "3.6.0", "liger": "0.8.5",
       "date": "2026-12-07T01:02:03Z", "command": "hearth bench softmax --sizes models --out out/models_x"}


def _rows():
    rows = []
    for p, ms in (("hearth", 1.0), ("liger", 1.2)):
        rows.append({"op": "softmax", "size_label": "Llama vocab 32000 x 4096 tokens", "shape": "4096x32000",
                     "dtype": "bfloat16", "mode": "full", "provider": p, "status": "ok", "ms": ms, "p20_ms": ms,
                     "p80_ms": ms, "value": 100.0 / ms, "metric": "GB/s", "formula": report.SPECS["softmax"].formula,
                     "work": 1e8, "limits": {}, "extra_mib": 10.0, "env": ENV, "size": {"M": 4096, "N": 32000}})
    return rows


def test_summary_names_the_command_beside_gpu_and_versions():
    md = report.summary_markdown(_rows())
    assert "NVIDIA H200" in md and "2.11.0+cu130" in md
    assert ENV["command"] in md, md[:600]


def test_an_op_page_names_gpu_versions_and_command():
    page = report.op_markdown("softmax", _rows())
    for what in ("NVIDIA H200", "torch: 2.11.0+cu130", "triton: 3.6.0", ENV["command"]):
        assert what in page, (what, page[:600])


def _figure_text(fig) -> str:
    texts = [t.get_text() for t in fig.texts] + [fig._suptitle.get_text() if fig._suptitle else ""]
    for ax in fig.axes:
        texts += [ax.get_title(), *(t.get_text() for t in ax.texts)]
    return "\n".join(texts)


def test_plots_name_gpu_versions_and_command(tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    assert len(plots.write_plots(tmp_path, _rows())) == 1
    assert plots.write_ratio_plot(tmp_path, _rows()) is not None
    assert len(figs) == 2
    for fig in figs:
        text = _figure_text(fig)
        for what in ("NVIDIA H200", "torch 2.11.0+cu130", "triton 3.6.0", ENV["command"]):
            assert what in text, (what, text)
