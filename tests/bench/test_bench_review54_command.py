"""The command a row says it was measured with (env.command) is the command line as typed."""

from __future__ import annotations

import sys

import torch

from hearth.bench import runner


def test_command_of_the_hearth_entry_point_names_bench_once(monkeypatch):
    """Under the `hearth` console script sys.argv is ['.../hearth', 'bench', ...]: the row read
    'hearth bench bench softmax --check', a command that does not exist."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/hearth", "bench", "softmax", "--check"])
    assert runner.env_info(torch.device("cpu"))["command"] == "hearth bench softmax --check"


def test_command_of_python_m_is_kept_as_is(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/src/hearth/bench/__main__.py", "softmax", "--check"])
    assert runner.env_info(torch.device("cpu"))["command"] == "/src/hearth/bench/__main__.py softmax --check"
