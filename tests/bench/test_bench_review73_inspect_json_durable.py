"""Review 73: `hearth inspect --json` writes its report crash-safely, as the bench's results and reports are.

inspect._write_json wrote a temp file and renamed it over the target with no flush: a rename is atomic but not a
flush, so after a host crash the new name can be on the disk while its data is not (an empty or torn JSON that a
script comparing runs then reads). hearth.durable's rule (b280fbf fixed the same unflushed temp + rename in the
bench's write_rows): the data flushed before the rename, the folder after it.
"""

from __future__ import annotations

import json
import os

from hearth import inspect as hi


def _report(label: str) -> hi.KernelReport:
    return hi.KernelReport(label=label, name="k", target="sm_90a", matmul_like=True, ptx={"wgmma": 4, "tma": 0},
                           sass=None, registers=128, spill_bytes=0, shared_bytes=1024, num_warps=4, num_stages=3)


def test_json_report_is_flushed_before_its_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "inspect.json"
    hi._write_json(target, [_report("fwd")])

    assert json.loads(target.read_text())[0]["label"] == "fwd"
    renames = [i for i, e in enumerate(events) if e[0] == "replace" and e[2] == str(target)]
    assert renames, events
    tmp = events[renames[-1]][1]
    # the renamed file's data reached the disk before the rename, and the folder's entry after it
    assert ("fsync", tmp) in events[:renames[-1]], events
    assert ("fsync", str(tmp_path)) in events[renames[-1]:], events
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inspect.json"]  # no temp file left behind


def test_a_failed_json_write_leaves_the_previous_report_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "inspect.json"
    hi._write_json(target, [_report("old")])
    before = target.read_text()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hi.json, "dumps", boom)
    try:
        hi._write_json(target, [_report("new")])
    except OSError:
        pass
    assert target.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inspect.json"]
