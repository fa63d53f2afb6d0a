"""Review 73: an ATTENTION-GOAL line names the cases where hearth's own row was not ok, and its goals are then missed.

attention_goal_lines counted a case only where hearth's row was ok: a case where hearth was wrong (or failed, ran out
of memory) was dropped without a word, so the line read e.g. "ATTENTION-GOAL full: 2 cases | vs cuDNN: ... goals:
>= 1.00x everywhere met, none below 0.95x met" with hearth wrong at a third case, and a mode where hearth was wrong
at every case printed no line at all. The goal is >= 1.0x against cuDNN at every case; a case hearth did not run
correctly is not met. The per-op GEOMEAN line already says so (goals_text: "N hearth case(s) not ok: MISSED", and a
skipped hearth case "not run: goals cover the measured cases only"); the attention goal line now says the same.
"""

from __future__ import annotations

from hearth.bench import report


def _rows(label, mode, hearth_ms, cudnn_ms, status="ok"):
    base = {"op": "attention", "size_label": label, "dtype": "bfloat16", "mode": mode}
    return [{**base, "provider": "hearth", "status": status, "ms": hearth_ms if status == "ok" else None},
            {**base, "provider": "sdpa_cudnn", "status": "ok", "ms": cudnn_ms}]


def test_a_case_where_hearth_is_wrong_is_named_and_misses_the_goal():
    rows = _rows("T1024", "full", 1.0, 1.2) + _rows("T4096", "full", 1.0, 1.1) + _rows("T8192", "full", None, 5.0, "wrong")
    (full,) = report.attention_goal_lines(rows)
    assert full.startswith("ATTENTION-GOAL full: 2 cases | vs cuDNN: >= 1.00x at 2/2")
    assert "1 hearth case(s) not ok (T8192 full wrong): MISSED" in full, full


def test_a_mode_where_hearth_failed_everywhere_still_has_its_line():
    rows = _rows("T1024", "fwd", 1.0, 1.2) + _rows("T1024", "full", None, 2.0, "error") + _rows("T4096", "full", None, 3.0, "oom")
    lines = report.attention_goal_lines(rows)
    assert len(lines) == 2, lines
    full = lines[0]
    assert full.startswith("ATTENTION-GOAL full: 0 cases | cuDNN not measured"), full
    assert "2 hearth case(s) not ok (T1024 full error, T4096 full oom): MISSED" in full
    assert "not ok" not in lines[1]


def test_a_skipped_hearth_case_is_named_as_not_run():
    rows = _rows("T1024", "fwd", 1.0, 1.2) + _rows("T4096", "fwd", None, 1.1, "skipped")
    (fwd,) = report.attention_goal_lines(rows)
    assert "1 hearth case(s) not run (T4096 fwd): goals cover the measured cases only" in fwd, fwd
    assert "MISSED" not in fwd  # hearth at least as fast as cuDNN at the one measured case


def test_all_ok_reads_as_before():
    rows = _rows("T1024", "fwd", 1.0, 1.2)
    (fwd,) = report.attention_goal_lines(rows)
    assert fwd.endswith("goals: >= 1.00x everywhere met, none below 0.95x met | FlashAttention not measured"), fwd
