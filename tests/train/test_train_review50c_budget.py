"""Review 50c (train): a small --memory-budget-gib is printed as given, not as "0.0 GiB".

Was: every GiB figure in the budget messages was formatted with one decimal, so `--memory-budget-gib 0.00001` (the
tests' way to ask for a refusal) was refused with "... need 0.0 GiB, over the 0.0 GiB budget": a refusal whose
numbers say the need fits. A small budget is legitimate for a small model (a tiny model on a CPU, the tests' own
runs), and the planner already refuses one that cannot fit with a message naming memory_budget_gib, so the fix is
the precision: one decimal from 1 GiB up (the messages as before), two significant digits below, and more where a
need and a budget would otherwise print the same.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import finetune

pytest.importorskip("transformers")
GIB = finetune.GIB


def _refusal(weights_gib: float, budget_gib: float) -> str:
    with pytest.raises(finetune.RunError) as err:
        finetune.refuse_over_budget(int(weights_gib * GIB), 0, budget_gib, qlora=False,
                                    qlora_weights_bytes=int(weights_gib * GIB / 4))
    return str(err.value)


def test_a_tiny_budget_and_need_print_their_value_not_zero():
    text = _refusal(0.0003, 0.00001)
    assert "0.0 GiB" not in text, text
    assert "need 0.0003 GiB" in text and "over the 0.00001 GiB budget" in text, text


def test_large_figures_keep_one_decimal():
    text = _refusal(27.3, 21.6)
    assert "need 27.3 GiB" in text and "over the 21.6 GiB budget" in text, text


def test_a_need_just_over_the_budget_never_prints_equal_to_it():
    text = _refusal(24.04, 24.0)
    assert "over the 24.0 GiB budget" in text and "need 24.04 GiB" in text, text
    text = _refusal(0.5004, 0.5)
    assert "need 0.5004 GiB" in text and "over the 0.5 GiB budget" in text, text


@pytest.mark.parametrize("value,expected", [
    (80.0, "80.0"), (4.0, "4.0"), (1.0, "1.0"), (0.25, "0.25"), (0.2, "0.2"), (0.05, "0.05"), (0.123, "0.12"),
    (0.00001, "0.00001"), (0.0, "0.0"),
])
def test_gib_format(value, expected):
    assert finetune.format_gib(value) == expected


def test_the_planner_reasons_print_a_small_budget(tmp_path, corpus, base):
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(base), "--out", str(tmp_path / "o"),
                                      "--no-patch", "--memory-budget-gib", "0.04", "--max-steps", "1"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text
    assert "0.04 GiB budget" in text and "0.0 GiB" not in text, text
