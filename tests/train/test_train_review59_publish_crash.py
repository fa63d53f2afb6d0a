"""Review 59: crash publish_adapter / finish_adapter_publish at every file operation, then crash the recovery at every
operation too, and check OUT ends with exactly the new adapter, and never shows a config beside another adapter's
weights."""

import os
import shutil
from pathlib import Path

from hearth.train import durable

OLD = {"adapter_config.json": "old-cfg", "adapter_model.safetensors": "old-w", "README.md": "old-card",
       "adapter_model.bin": "old-bin"}
NEW = {"adapter_config.json": "new-cfg", "adapter_model.safetensors": "new-w", "README.md": "new-card"}
OTHER = {"run.toml": "run", "metrics.jsonl": "m\n", "notes.txt": "user's own"}


class Crash(BaseException):
    pass


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    out.mkdir()
    for k, v in {**OLD, **OTHER}.items():
        (out / k).write_text(v)
    tmp = out / durable.ADAPTER_TMP
    tmp.mkdir()
    for k, v in NEW.items():
        (tmp / k).write_text(v)
    return out, tmp


class Injector:
    def __init__(self, monkeypatch, crash_at):
        self.n = 0
        self.crash_at = crash_at
        self.mp = monkeypatch
        real_replace, real_rename, real_rmtree, real_rmdir = os.replace, Path.rename, shutil.rmtree, Path.rmdir
        real_unlink = os.unlink
        inj = self

        def step():
            inj.n += 1
            if inj.crash_at is not None and inj.n == inj.crash_at:
                raise Crash(inj.n)

        def replace(a, b, *args, **kw):
            step()
            return real_replace(a, b, *args, **kw)

        def rename(self_, target):
            step()
            return real_rename(self_, target)

        def rmtree(p, *a, **kw):
            # a crash in the middle of a tree deletion: delete one entry then crash
            if inj.crash_at is not None and inj.n + 1 == inj.crash_at and Path(p).is_dir():
                entries = sorted(Path(p).iterdir())
                if entries:
                    e = entries[0]
                    (real_rmtree(e) if e.is_dir() else real_unlink(e))
            step()
            return real_rmtree(p, *a, **kw)

        def rmdir(self_):
            step()
            return real_rmdir(self_)

        monkeypatch.setattr(durable.os, "replace", replace)
        monkeypatch.setattr(Path, "rename", rename)
        monkeypatch.setattr(shutil, "rmtree", rmtree)
        monkeypatch.setattr(Path, "rmdir", rmdir)


def _adapter_state(out: Path) -> str:
    cfg = out / "adapter_config.json"
    if not cfg.exists():
        return "none"
    which = cfg.read_text().split("-")[0]
    w = (out / "adapter_model.safetensors").read_text()
    assert w.startswith(which), f"config {which} beside weights {w}"
    return which


def _count_ops(tmp_path, monkeypatch) -> int:
    out, tmp = _setup(tmp_path / "count")
    inj = Injector(monkeypatch, None)
    durable.publish_adapter(tmp, out)
    monkeypatch.undo()
    return inj.n


def test_crash_anywhere_then_crash_anywhere_in_recovery(tmp_path, monkeypatch):
    (tmp_path / "count").mkdir()
    total = _count_ops(tmp_path, monkeypatch)
    assert total > 5
    problems = []
    for first in range(1, total + 1):
        for second in [None, *range(1, total + 1)]:
            case = tmp_path / f"c{first}_{second}"
            case.mkdir()
            out, tmp = _setup(case)
            with monkeypatch.context() as mp:
                Injector(mp, first)
                try:
                    durable.publish_adapter(tmp, out)
                except Crash:
                    pass
            mid = _adapter_state(out)
            committed = not tmp.exists()
            if second is not None:
                with monkeypatch.context() as mp:
                    Injector(mp, second)
                    try:
                        durable.finish_adapter_publish(out)
                    except Crash:
                        pass
                _adapter_state(out)
            durable.finish_adapter_publish(out)
            final = _adapter_state(out)
            want = "new" if committed else "old"
            files = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
            leftovers = [p.name for p in out.iterdir()
                         if p.is_dir() and not (p.name == durable.ADAPTER_TMP and not committed)]
            new_wrong = any(files.get(k) != v for k, v in NEW.items()) or "adapter_model.bin" in files
            if final != want or leftovers or any(files.get(k) != v for k, v in OTHER.items()) or \
                    (want == "new" and new_wrong):
                problems.append((first, second, mid, final, sorted(files.items()), leftovers))
    assert not problems, problems[:5]
