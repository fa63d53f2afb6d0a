"""hearth.kernels._common.pick_config: the launch-config picker shared by the row kernels."""

import torch

import hearth.kernels._common as common


class _FakeCudaDevice:
    type = "cuda"


def test_pick_config_times_candidates_once_and_keeps_the_fastest(monkeypatch):
    """The launch-config picker (shared by the row kernels): default off the GPU; on the GPU it times
    every candidate, skips one that fails to launch, keeps the fastest and caches it per key."""
    calls = []
    # the timer runs the launch once and reports the candidate's made-up time
    fake_ms = {"a": 3.0, "b": 1.0, "c": 2.0}

    def fake_time(candidates, launch):
        out = []
        for cfg in candidates:
            try:
                out.append(launch(cfg))
            except RuntimeError as e:
                out.append(type(e).__name__)
        return out

    def launch(cfg):
        calls.append(cfg)
        if cfg == "bad":
            raise RuntimeError("out of resources")
        return fake_ms[cfg]

    # off the GPU (and under the interpreter): the first candidate, nothing run, nothing cached
    assert common.pick_config(("k", 1), ["a", "b"], launch, torch.device("cpu")) == "a"
    assert calls == []
    monkeypatch.setattr(common, "interpret_mode", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(common, "_time_candidates", fake_time)
    monkeypatch.setattr(common, "_PICKED", {})
    assert common.pick_config(("k", 1), ["a", "bad", "b", "c"], launch, _FakeCudaDevice()) == "b"
    assert calls == ["a", "bad", "b", "c"]
    # cached: no second timing for the same key
    assert common.pick_config(("k", 1), ["a", "bad", "b", "c"], launch, _FakeCudaDevice()) == "b"
    assert calls == ["a", "bad", "b", "c"]
    # a single candidate is returned untimed
    assert common.pick_config(("k", 2), ["c"], launch, _FakeCudaDevice()) == "c"
    assert len(calls) == 4


def test_a_pick_on_few_rows_is_not_reused_for_many(monkeypatch):
    """rows joins the key as its power-of-two bucket (capped): a pick made on a 64-row slice is timed again
    at 4096 rows, 3000 rows reuse the 4096 pick, and past the cap every count shares one pick."""
    monkeypatch.setattr(common, "interpret_mode", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(common, "_PICKED", {})
    timed = []
    fast = {64: "a", 4096: "b"}
    rows_now = [64]

    def fake_time(candidates, launch):
        timed.append(rows_now[0])
        return [0.0 if c == fast.get(rows_now[0], "a") else 1.0 for c in candidates]

    monkeypatch.setattr(common, "_time_candidates", fake_time)
    for rows, want in ((64, "a"), (4096, "b"), (3000, "b"), (64, "a")):
        rows_now[0] = rows
        assert common.pick_config(("k",), ["a", "b"], lambda c: None, _FakeCudaDevice(), rows=rows) == want
    assert timed == [64, 4096]
    cap = common.ROWS_BUCKET_CAP
    assert common.rows_bucket(1) == 1 and common.rows_bucket(3000) == 4096 and common.rows_bucket(4096) == 4096
    assert common.rows_bucket(cap + 1) == common.rows_bucket(50 * cap) == cap


class _FakeClock:
    """A GPU and its host for _time_candidates on the CPU. The host queues each launch in host_ms[cfg] (0 unless
    given); a kernel starts once queued and once the GPU is free, and runs its candidate's time, times a slowdown
    while the 'GPU' is still ramping up its clocks (the first `ramp` launches after the compiles). A mark is the
    GPU's time when it reaches it; hold(ms) keeps the GPU busy for ms from when it is queued."""

    def __init__(self, true_ms, ramp=0, slow=1.0, host_ms=None):
        self.true_ms, self.ramp, self.slow, self.launches = true_ms, ramp, slow, []
        self.host, self.gpu, self.host_cost, self.holds = 0.0, 0.0, host_ms or {}, []

    def launch(self, cfg):
        self.launches.append(cfg)
        self.host += self.host_cost.get(cfg, 0.0)
        ms = self.true_ms[cfg]
        if len(self.launches) > 2 * len(self.true_ms) and self.ramp > 0:  # past the compile + estimate launches
            self.ramp -= 1
            ms *= self.slow
        self.gpu = max(self.gpu, self.host) + ms

    def mark(self):
        self.gpu = max(self.gpu, self.host)
        return self.gpu

    def hold(self, ms):
        self.holds.append(ms)
        self.gpu = max(self.gpu, self.host) + ms

    def host_ms(self):
        return self.host

    def sync(self):
        self.host = max(self.host, self.gpu)

    @staticmethod
    def ms(start, end):
        return end - start


def test_candidates_are_timed_in_interleaved_rounds_and_ranked_by_their_median():
    """A clock ramp at the start of the timed rounds (the GPU idle during the compiles) slows the first
    launches 3x. Timed one candidate after the other, the first candidate would carry all of it; in rotated
    rounds with a median each candidate is hit in at most one round, and the true order comes out."""
    true_ms = {"a": 0.10, "b": 0.09, "c": 0.12}
    clock = _FakeClock(true_ms, ramp=3, slow=3.0)
    timed = common._time_candidates(["a", "b", "c"], clock.launch, clock)
    assert [round(t, 6) for t in timed] == [0.10, 0.09, 0.12]
    # each candidate: one warm-up, one estimate, then PICK_ROUNDS blocks of ceil(PICK_BLOCK_MS / its ms)
    for cfg, ms in true_ms.items():
        reps = min(common.PICK_MAX_REPS, -(-common.PICK_BLOCK_MS // ms))
        assert clock.launches.count(cfg) == 2 + common.PICK_ROUNDS * reps
    # rotated: round r starts with candidate r (mod 3), so no candidate is always timed first
    first = clock.launches[6]
    assert first == "a" and clock.launches[6 + 3 * 3] == "b"  # a's block (3 launches), b's, c's (3 each)...


def test_a_block_is_capped_and_a_slow_candidate_runs_once_a_round():
    clock = _FakeClock({"tiny": 0.001, "slow": 2.0})
    timed = common._time_candidates(["tiny", "slow"], clock.launch, clock)
    assert [round(t, 9) for t in timed] == [0.001, 2.0]
    assert clock.launches.count("tiny") == 2 + common.PICK_ROUNDS * common.PICK_MAX_REPS
    assert clock.launches.count("slow") == 2 + common.PICK_ROUNDS


def test_a_block_is_held_so_the_host_s_launch_overhead_does_not_rank_the_candidates():
    """"pair" is the faster kernel (0.050 ms against 0.060) but costs its host 0.09 ms a launch (a zeroed buffer, two
    launches) against 0.07. Timed back to back from an idle GPU, the blocks measure the host (0.09 and 0.07 ms a
    launch) and "row" wins: rms_norm's rowpair backward on the H200 at 2048 x 16384, which the whole op ranked fastest.
    Each block behind a hold longer than its queueing measures the kernels: pair comes out at its own 0.050."""
    clock = _FakeClock({"row": 0.060, "pair": 0.050}, host_ms={"row": 0.07, "pair": 0.09})
    timed = common._time_candidates(["row", "pair"], clock.launch, clock)
    assert [round(t, 9) for t in timed] == [0.060, 0.050]
    assert common.pick_among(["row", "pair"], timed) == "pair"
    # every block (and each estimate) was held; each hold outlasts its block's queueing
    assert len(clock.holds) == 2 + 2 * common.PICK_ROUNDS
    # (5 launches a block each: ceil(0.25 / 0.06) and ceil(0.25 / 0.05))
    assert sorted(set(clock.holds[2:])) == [common._hold_ms(5, 0.07), common._hold_ms(5, 0.09)]
    assert common._hold_ms(5, 0.09) > 5 * 0.09

    class NoHold(_FakeClock):  # the same GPU and host, timed without holds: what the picker did before
        def hold(self, ms):
            pass

    unheld = NoHold({"row": 0.060, "pair": 0.050}, host_ms={"row": 0.07, "pair": 0.09})
    timed = common._time_candidates(["row", "pair"], unheld.launch, unheld)
    assert timed[1] > 0.08 and common.pick_among(["row", "pair"], timed) == "row"  # about its host time


def test_a_hold_is_twice_the_queueing_and_capped():
    assert common._hold_ms(4, 0.02) == 2 * 4 * 0.02 + 0.05
    assert common._hold_ms(64, 1.0) == common.PICK_HOLD_MAX_MS


def test_a_candidate_that_does_not_launch_is_named_and_skipped():
    clock = _FakeClock({"a": 0.2, "b": 0.1})

    def launch(cfg):
        if cfg == "bad":
            raise RuntimeError("out of resources")
        clock.launch(cfg)

    timed = common._time_candidates(["a", "bad", "b"], launch, clock)
    assert timed[1] == "RuntimeError" and [round(timed[0], 9), round(timed[2], 9)] == [0.2, 0.1]


def test_memory_tie_break_keeps_the_leanest_of_the_level_candidates():
    """pick_among: without `memory`, the fastest; with it, the least-allocating of the candidates within
    PICK_MEMORY_TIE of the fastest (equal bytes: the faster); a candidate that did not launch is never kept."""
    cands = ["fast_fat", "level_lean", "slow_leanest", "broken"]
    timed = [1.00, 1.00 + common.PICK_MEMORY_TIE / 2, 1.5, "OutOfResources"]
    mem = {"fast_fat": 8 << 20, "level_lean": 4 << 20, "slow_leanest": 1 << 20, "broken": 0}.get
    assert common.pick_among(cands, timed) == "fast_fat"
    assert common.pick_among(cands, timed, mem) == "level_lean"
    # just past the tie: the time wins
    timed[1] = 1.00 * (1 + common.PICK_MEMORY_TIE) * 1.001
    assert common.pick_among(cands, timed, mem) == "fast_fat"
    # equal bytes within the tie: the faster
    assert common.pick_among(["a", "b"], [1.001, 1.0], lambda c: 5) == "b"
    assert common.pick_among(["a", "b"], ["X", "Y"], mem) == "a"  # none launched: the default
    # the pick that set the tie (H100, 2026-12-06, rms_norm backward at 5120 x 12289, HEARTH_PICK_LOG): the plain
    # 2-an-SM form at 0.1339 ms with 257 fp32 partial rows, its rowpair form at 0.1368 with 129: the rowpair is kept
    pick = [("row", 1, 2, 8, 4), ("row", 1, 1, 16, 4), ("rowpair", 1, 2, 8, 4)]
    rows = {pick[0]: 257, pick[1]: 129, pick[2]: 129}
    assert common.pick_among(pick, [0.1339, 0.1392, 0.1368], lambda c: rows[c] * 5120 * 4) == pick[2]


def test_rms_and_layer_norm_backward_picks_weigh_the_partial_buffer(monkeypatch):
    """The norms' backward picks pass a memory function that is the fp32 partial buffer of the candidate's grid
    (rms_norm: grid x n x 4 bytes, layer_norm: twice that), and none when no weight gradient is taken."""
    import importlib

    rn = importlib.import_module("hearth.kernels.rms_norm")
    ln = importlib.import_module("hearth.kernels.layer_norm")
    seen = []

    def spy(key, candidates, launch, device, rows=None, memory=None):
        seen.append((key[0], memory, candidates, rows))
        return candidates[0]

    monkeypatch.setattr(rn, "num_sms", lambda device: 4)
    monkeypatch.setattr(rn, "pick_config", spy)
    monkeypatch.setattr(ln, "pick_config", spy)
    from tests.kernels.tolerance import DEVICE

    x = torch.randn(64, 32, device=DEVICE)
    w = torch.randn(32, device=DEVICE, requires_grad=True)
    dy = torch.randn(64, 32, device=DEVICE)
    rstd = torch.ones(64, device=DEVICE)
    rn._backward(dy, x, w, rstd, need_dw=True)
    rn._backward(dy, x, w, rstd, need_dw=False)
    ln._backward(dy, x, w, torch.zeros_like(rstd), rstd, need_dw=True)
    ln._backward(dy, x, w, torch.zeros_like(rstd), rstd, need_dw=False)
    bwd = [s for s in seen if s[0].endswith("_bwd")]
    assert [s[0] for s in bwd] == ["rms_norm_bwd", "rms_norm_bwd", "layer_norm_bwd", "layer_norm_bwd"]
    assert bwd[1][1] is None and bwd[3][1] is None
    for (_, memory, candidates, rows), per in ((bwd[0], 1), (bwd[2], 2)):
        grids = {rn.bwd_grid(cfg, rows, "cpu")[0] for cfg in candidates}
        assert len(grids) > 1  # the candidates differ in memory, so the tie-break has something to weigh
        for cfg in candidates:
            assert memory(cfg) == per * rn.bwd_grid(cfg, rows, "cpu")[0] * 32 * 4
