"""Review 54 (train): loss.png is replaced whole or not at all.

Was: plot_losses saved the figure straight onto OUT/loss.png, so a run stopped while the plot was being written (Ctrl-C,
a kill, a full disk) left a truncated loss.png in place of the last good one (a resumed run writes it again over its
earlier run's), where metrics.json beside it goes through a temporary name and one rename.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth.train import finetune

ROWS = [{"step": 1, "loss": 2.0, "eval_loss": None}, {"step": 2, "loss": 1.5, "eval_loss": 1.7}]


def test_a_plot_interrupted_while_written_leaves_the_previous_loss_png(tmp_path, monkeypatch):
    import matplotlib.figure

    path = tmp_path / "loss.png"
    finetune.plot_losses(ROWS, path)
    before = path.read_bytes()
    assert before.startswith(b"\x89PNG")
    real = matplotlib.figure.Figure.savefig

    def cut_short(self, fname, *args, **kwargs):  # the first bytes written, then the process is stopped
        Path(fname).write_bytes(before[:16])
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", cut_short)
    with pytest.raises(KeyboardInterrupt):
        finetune.plot_losses(ROWS + [{"step": 3, "loss": 1.2, "eval_loss": None}], path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png"]  # nothing left beside it
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", real)
    finetune.plot_losses(ROWS + [{"step": 3, "loss": 1.2, "eval_loss": None}], path)
    assert path.read_bytes() != before and path.read_bytes().startswith(b"\x89PNG")
