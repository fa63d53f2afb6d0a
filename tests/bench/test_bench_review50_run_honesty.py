"""Review 50: what a case's rows say about its providers.

A sticky CUDA error stops the rest of its own case too, not only the later cases. After an illegal memory access
or a device-side assert every CUDA call in the process fails. runner._poisoned stopped the run at the end of the
case, but the case's remaining providers still ran: their rows said "error: CUDA error: an illegal memory access
was encountered", blaming (say) Liger or cuDNN for what hearth did, and the verdict listed them as failed peers
("not ranked: liger error"). They are now recorded as skipped, the reason naming the provider that left the error,
as the later cases' rows already were.

setup_s (the first call: compile, JIT, autotune) stops before the correctness check, which is the harness's time.
"""

from __future__ import annotations

import torch

from hearth.bench import cases, providers as P, runner


def _softmax_bind(op, inputs, spec, size, rg, check):
    return P.Bound(lambda: torch.softmax(inputs["x"], dim=-1), [inputs["x"]])


def _sticky_bind(op, inputs, spec, size, rg, check):
    def fn():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...")
    return P.Bound(fn, [inputs["x"]])


def test_providers_after_a_sticky_error_in_the_same_case_are_skipped_not_blamed(monkeypatch):
    """On a CUDA device (runner._sticky; the CPU has no sticky errors, so this test says it is one)."""
    monkeypatch.setattr(runner, "_sticky", lambda device: True)
    ran = []

    def counting(op, inputs, spec, size, rg, check):
        ran.append("liger")
        return _softmax_bind(op, inputs, spec, size, rg, check)

    reg = {"eager": _softmax_bind, "hearth": _sticky_bind, "liger": counting, "compile": _softmax_bind}
    rows = runner.run_case(cases.SPECS["softmax"], dict(M=3, N=40), "float32", "fwd", ["eager", "hearth", "liger", "compile"],
                           torch.device("cpu"), {}, {"gpu": "test"}, False, True, reg)
    by = {r["provider"]: r for r in rows}
    assert [r["provider"] for r in rows] == ["eager", "hearth", "liger", "compile"]  # every provider has its row
    assert by["eager"]["status"] == "ok"
    assert by["hearth"]["status"] == "error" and "illegal memory access" in by["hearth"]["reason"]
    assert ran == []  # liger never ran after the error
    for p in ("liger", "compile"):
        assert by[p]["status"] == "skipped", by[p]
        assert "hearth" in by[p]["reason"] and "sticky CUDA error" in by[p]["reason"]
    # the run stops after this case, as before
    assert runner._poisoned(rows)


def test_on_the_cpu_the_case_s_other_providers_still_run():
    """--check on the CPU: a "CUDA error" there sticks to nothing, the case's other providers run (the run still stops
    after the case: test_bench_harness.test_sticky_cuda_error_stops_the_rest)."""
    assert runner._sticky(torch.device("cuda")) and not runner._sticky(torch.device("cpu"))
    reg = {"hearth": _sticky_bind, "eager": _softmax_bind}
    rows = runner.run_case(cases.SPECS["softmax"], dict(M=3, N=40), "float32", "fwd", ["hearth", "eager"],
                           torch.device("cpu"), {}, {"gpu": "test"}, False, True, reg)
    assert [r["status"] for r in rows] == ["error", "ok"]


def test_setup_time_is_the_first_call_not_the_correctness_check(monkeypatch):
    """setup_s is the first call (compile / JIT / autotune included); the correctness check that follows it (now
    slice by slice, with an fp32 pass over every output and gradient) is the harness's own time."""
    import time

    from hearth.bench import check

    real = check.check

    def slow_check(*a, **k):
        time.sleep(2.0)
        return real(*a, **k)

    monkeypatch.setattr(check, "check", slow_check)
    rows = runner.run_case(cases.SPECS["softmax"], dict(M=3, N=40), "float32", "fwd", ["hearth"], torch.device("cpu"), {},
                           {"gpu": "test"}, False, True, {"hearth": _softmax_bind})
    assert rows[0]["status"] == "ok" and rows[0]["setup_s"] < 1.5, rows[0]
