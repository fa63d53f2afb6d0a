"""hearth.bench: the benchmark harness (fused against fused, time AND memory).

    hearth bench                                # headline shapes (the published targets), every op and provider, CUDA
    hearth bench softmax --sizes sweep          # growth curves; or --sizes 1024,4096 for the op's size knob
    hearth bench --check                        # CPU self-test under TRITON_INTERPRET=1 (CI)
    hearth bench --report-only --out D --merge D1 --merge D2   # one report from several runs
    python -m hearth.bench ...                  # same options without typer (GPU boxes without pydantic)

Layout: cases.py (op specs: sizes, byte / FLOP formulas, inputs, fp32 references), providers.py
(hearth, eager, torch.compile, Liger, vendor libraries), check.py (correctness against fp32),
timing.py (CUDA-event timing, peak memory, speed-of-light limits), report.py (JSONL, Markdown,
verdicts), plots.py (PNG), runner.py (the loop, budget, progress). Nothing here imports pydantic.
"""
