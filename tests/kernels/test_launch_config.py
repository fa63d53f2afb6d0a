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

    def fake_bench(fn, **kwargs):
        return fn()

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
    monkeypatch.setattr(common, "_time_ms", fake_bench)
    monkeypatch.setattr(common, "_PICKED", {})
    assert common.pick_config(("k", 1), ["a", "bad", "b", "c"], launch, _FakeCudaDevice()) == "b"
    assert calls == ["a", "bad", "b", "c"]
    # cached: no second timing for the same key
    assert common.pick_config(("k", 1), ["a", "bad", "b", "c"], launch, _FakeCudaDevice()) == "b"
    assert calls == ["a", "bad", "b", "c"]
    # a single candidate is returned untimed
    assert common.pick_config(("k", 2), ["c"], launch, _FakeCudaDevice()) == "c"
    assert len(calls) == 4
