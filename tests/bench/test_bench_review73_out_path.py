"""Review 73: `hearth bench --out` that cannot take the results is refused at start, naming the option.

main checked nothing about OUT: the first write (results.jsonl, after the first case had run: on a GPU after the
compile warm-up and the case's timing) met it, and the run died there with a traceback, exit 1:

- `--out results.txt` (a file): FileExistsError from mkdir;
- `--out some_file/sub` (a file on the way): NotADirectoryError;
- an OUT (or a --merge folder) whose results.jsonl is a folder: IsADirectoryError, also under --report-only.

Now each is exit 2 naming --out / --merge before any case runs, and nothing is written.
"""

from __future__ import annotations

import pytest
import torch

from hearth.bench import runner
from hearth.bench import providers as P


def _registry(calls):
    def hearth(op, inputs, spec, size, rg, check):
        calls.append(size)
        return P.Bound(lambda: torch.softmax(inputs["x"], -1), [inputs["x"]])

    return {"hearth": hearth}


def _run(out, **kw):
    calls: list = []
    code = runner.main(ops=["softmax"], check=True, out=out, registry=_registry(calls), plots=False,
                       providers=["hearth"], **kw)
    return code, calls


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_an_out_that_is_or_lies_under_a_file_is_refused_before_any_case(tmp_path, capsys, where):
    blocker = tmp_path / "results.txt"
    blocker.write_text("mine\n")
    out = blocker if where == "file" else blocker / "sub"
    code, calls = _run(out)
    text = " ".join(capsys.readouterr().out.split())  # the console wraps long paths
    assert code == 2
    assert "--out" in text and "is a file" in text
    assert calls == []  # nothing ran
    assert blocker.read_text() == "mine\n"


def test_a_results_jsonl_folder_in_out_is_refused(tmp_path, capsys):
    (tmp_path / "results.jsonl").mkdir()
    code, calls = _run(tmp_path)
    assert code == 2
    assert "--out" in capsys.readouterr().out
    assert calls == []


def test_report_only_with_a_results_jsonl_folder_in_out_or_a_merge_folder(tmp_path, capsys):
    (tmp_path / "out" / "results.jsonl").mkdir(parents=True)
    assert runner.main(out=tmp_path / "out", report_only=True, plots=False) == 2
    assert "--out" in capsys.readouterr().out
    (tmp_path / "other" / "results.jsonl").mkdir(parents=True)
    assert runner.main(out=tmp_path / "new", report_only=True, merge=[tmp_path / "other"], plots=False) == 2
    assert "--merge" in capsys.readouterr().out
    assert not (tmp_path / "new").exists()


def test_a_new_out_folder_still_runs(tmp_path):
    code, calls = _run(tmp_path / "a" / "b")
    assert code == 0
    assert calls and (tmp_path / "a" / "b" / "results.jsonl").is_file()
