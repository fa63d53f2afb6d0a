"""The layer rule for the bench harness's file writes: imports point down only, and bench sits below train. The
atomic-write helpers the reports use (write_text, write_file) live in hearth.durable, which imports nothing of
hearth; importing the report and plot modules pulls in no hearth.train module (they used to import
hearth.train.durable for those helpers)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import hearth.durable
assert not [m for m in sys.modules if m.startswith("hearth.") and m != "hearth.durable"], sorted(sys.modules)
import hearth.bench.report, hearth.bench.plots
print(sorted(m for m in sys.modules if m.startswith("hearth.train")))
"""


def test_bench_reports_import_nothing_of_train(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_train_durable_uses_the_shared_helpers():
    """hearth.train.durable's publish logic flushes with the same fsync the single-file writes use (one copy)."""
    import hearth.durable
    import hearth.train.durable

    assert hearth.train.durable.fsync is hearth.durable.fsync
