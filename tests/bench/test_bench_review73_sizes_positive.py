"""Review 73: a --sizes list with a value below 1 fails at start naming the option.

_explicit_values took any integer: `--sizes 0,-4` planned softmax cases of N = 0 and N = -4 (on a GPU each ended as
rows of status 'error' -- 'reference failed' -- written to results.jsonl and counted on the GEOMEAN line as hearth
cases not ok: a mistyped option read as failures of hearth), and `hearth bench attention --sizes 0` died in the
planning with a ZeroDivisionError traceback (the attention knob divides 16384 by T) instead of exit 2 naming --sizes.
"""

from __future__ import annotations

import pytest
import torch

from hearth.bench import cases, runner
from hearth.bench import providers as P


@pytest.mark.parametrize("op", sorted(cases.SPECS))
@pytest.mark.parametrize("sizes", ["0", "-4", "1024,0"])
def test_a_size_below_one_is_refused_naming_sizes(op, sizes):
    with pytest.raises(ValueError, match="sizes"):
        cases.cases_for(cases.SPECS[op], sizes, None, False)


def _registry():
    def good(op, inputs, spec, size, rg, check):
        return P.Bound(lambda: torch.softmax(inputs["x"], -1), [inputs["x"]])

    return {"hearth": good}


@pytest.mark.parametrize("op", ["softmax", "attention"])
def test_the_cli_exits_2_naming_sizes_and_writes_nothing(tmp_path, op, capsys):
    code = runner.main(ops=[op], sizes="0", check=True, out=tmp_path, registry=_registry(), plots=False,
                       providers=["hearth"])
    assert code == 2
    assert "sizes" in capsys.readouterr().out
    assert not (tmp_path / "results.jsonl").exists()


def test_positive_sizes_still_plan():
    assert cases.cases_for(cases.SPECS["attention"], "1024,2048", None, False)
    assert cases.cases_for(cases.SPECS["softmax"], "1,4096", None, False)
