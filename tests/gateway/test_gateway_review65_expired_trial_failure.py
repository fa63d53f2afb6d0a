"""Review 65: a failure that carries a half-open trial token whose lease has run out is an ordinary failure in the
in-process store, as it is in Redis (where the lease key is gone with its TTL).

The in-process store compared the token alone: with the lease expired and no other request claiming the trial since,
the late failure still counted as "the half-open trial failed" and opened the breaker for cooldown_s at once, even
when the consecutive failures were below breaker_failures; a gateway on Redis counted it as one failure more. The
two stores are meant to be the same breaker (state.py's contract), and tests of one stand for the other.
"""

import asyncio

import pytest

from tests.gateway.gateway_helpers import BACKENDS, end_cooldown, expire_trial, started_store


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failure_on_an_expired_trial_lease_counts_as_one_failure(backend, clock):
    async def main():
        async with started_store(backend) as s:
            # opened by an upstream's Retry-After (open_s) on one failure: below the threshold of 3
            await s.failure("a", threshold=3, cooldown_s=30.0, open_s=30.0, why="retry-after", status=None,
                            trial=None)
            await end_cooldown(s, backend, clock)
            token = await s.claim_trial("a", lease_s=30.0)
            assert token
            await expire_trial(s, backend, clock)
            opened = await s.failure("a", threshold=3, cooldown_s=30.0, open_s=None, why="500", status=None,
                                     trial=token, trial_why="the half-open trial failed")
            return opened, (await s.breakers(["a"]))[0]

    opened, snap = asyncio.run(main())
    assert not opened, snap  # before (memory): opened for 30 s as the trial's failure
    assert snap.failures == 2 and snap.open_left_s == 0.0, snap
