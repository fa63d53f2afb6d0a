"""--sizes under --check: a mistyped value fails at start naming the option, as it does without --check."""

from __future__ import annotations

import pytest
import torch

from hearth.bench import cases, runner
from hearth.bench import providers as P


def _registry():
    def good(op, inputs, spec, size, rg, check):
        return P.Bound(lambda: torch.softmax(inputs["x"], -1), [inputs["x"]])

    return {"hearth": good}


@pytest.mark.parametrize("sizes", ["modles", "big", ","])
def test_a_mistyped_sizes_fails_under_check_too(tmp_path, sizes, capsys):
    """Under --check a mistyped --sizes ('modles' for 'models') was accepted and the plain check sizes ran in its
    place, with no word that the option was not understood."""
    code = runner.main(ops=["softmax"], sizes=sizes, check=True, out=tmp_path, registry=_registry(),
                       plots=False, providers=["hearth"])
    assert code == 2
    assert "sizes must" in capsys.readouterr().out
    assert not (tmp_path / "results.jsonl").exists()


def test_valid_sizes_still_run_under_check():
    spec = cases.SPECS["softmax"]
    for sizes in ("headline", "sweep", "1024,2048"):
        assert cases.cases_for(spec, sizes, None, True)
