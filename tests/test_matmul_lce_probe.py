"""scripts/gpu/matmul_lce_probe.py --chunk-gemms on the CPU at toy sizes (timing stubbed): every chunk GEMM and its
split-K forms run, the split-K sums equal the plain GEMM within bf16 rounding, and a row is kept per measurement."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_chunk_gemms_rows_and_split_k_errors():
    mod = runpy.run_path(str(ROOT / "scripts" / "gpu" / "matmul_lce_probe.py"), run_name="matmul_lce_probe")
    probe = mod["probe_chunk_gemms"]
    calls = []

    def fake_bench(fn, grad_to_none=None):  # run the GEMM once (its result is what the errors read), time 1 ms
        fn()
        calls.append(fn)
        return 1.0

    probe.__globals__["bench"] = fake_bench
    rows: list = []
    # 300 rows, V 6000: chunk_rows_for gives 300 rows (one chunk: 3.6 MB of logits); V 6001 has no 2-, 4- or 8-way split
    # 2000 rows, V 600: 3 chunks of 768 (chunk_rows_for's 768-row cap; 667 rounded up to 256), so the 2C grad_W row is there
    probe(rows, cases=[("toy", 300, 64, 6000, False), ("odd V", 40, 16, 6001, False), ("chunked", 2000, 16, 600, False)],
          device="cpu")
    toy = [r for r in rows if r["case"] == "chunk_gemms toy"]
    assert [r["gemm"] for r in toy] == ["logits x_c @ W^T", "grad_x g_c @ W", "grad_x split-K 2 (bmm + sum)",
                                        "grad_x split-K 4 (bmm + sum)", "grad_x split-K 8 (bmm + sum)",
                                        "grad_W += g_c^T @ x_c"]
    errs = [r["rel_err"] for r in toy if r["rel_err"] is not None]
    assert len(errs) == 4 and max(errs) < 1e-2, errs  # bf16 output: one rounding (the plain GEMM's too)
    assert all(r["chunk_rows"] == 300 and r["chunked_total_ms"] == 1.0 for r in toy)
    odd = [r["gemm"] for r in rows if r["case"] == "chunk_gemms odd V"]
    assert not any("split-K" in g for g in odd) and len(odd) == 3
    chunked = [(r["gemm"], r["chunk_rows"]) for r in rows if r["case"] == "chunk_gemms chunked"]
    assert chunked[-2:] == [("grad_W += g_c^T @ x_c", 768), ("grad_W += g_c^T @ x_c", 1536)], chunked
    assert len(calls) == len(rows) + 3 * 3  # each row's chunked call, and three unchunked GEMMs in each case
