"""The login limiter (failures per username and, more loosely, per client address)."""

from __future__ import annotations

from hearth.app.accounts import LoginLimiter


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_limits_per_user_and_forgets_after_the_window():
    clock = Clock()
    lim = LoginLimiter(3, 60, clock=clock)
    for _ in range(3):
        assert lim.retry_after("user:a", "ip:1") == 0
        lim.failed("user:a", "ip:1")
    assert 59 < lim.retry_after("user:a", "ip:1") <= 60
    assert lim.retry_after("user:b", "ip:2") == 0  # other users are unaffected
    clock.now += 61
    assert lim.retry_after("user:a", "ip:1") == 0
    assert lim._fails == {}  # old failures are dropped, not kept forever


def test_client_address_limit_is_looser_but_real():
    clock = Clock()
    lim = LoginLimiter(2, 60, client_factor=4, clock=clock)
    for i in range(7):
        lim.failed(f"user:u{i}", "ip:9")
    assert lim.retry_after("user:new", "ip:9") == 0
    lim.failed("user:u7", "ip:9")
    assert lim.retry_after("user:new", "ip:9") > 0  # 8 = 2 x 4 failures from one address


def test_success_clears_the_user_key():
    lim = LoginLimiter(2, 60, clock=Clock())
    lim.failed("user:a")
    lim.succeeded("user:a")
    lim.failed("user:a")
    assert lim.retry_after("user:a") == 0


def test_a_spray_of_names_does_not_grow_the_table_forever():
    clock = Clock()
    lim = LoginLimiter(3, 60, clock=clock)
    lim.SWEEP_AT = 100
    for i in range(150):
        lim.failed(f"user:spray{i}")
    clock.now += 61
    lim.failed("user:late")
    assert list(lim._fails) == ["user:late"]
