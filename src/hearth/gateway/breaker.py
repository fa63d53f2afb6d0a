"""Per-provider circuit breaker: cool a provider down after failures, or when it says Retry-After.

    closed     --(breaker_failures consecutive failures)-->  open for cooldown_s
    closed     --(429/503 with Retry-After: N)------------->  open for min(N, max_retry_after_s)
    open       --(the cooldown ends)------------------------>  half-open
    half-open  --(ONE trial request, leased)---------------->  success: closed; failure: open again
               while the trial is in flight every other request skips the provider (it goes on to
               the next one), so a provider that is still broken costs one request its timeout,
               not every request that arrives when the cooldown ends

A success closes a tripped breaker only when it is the half-open trial's (the attempt holding the trial token,
its lease not expired). The success of any other attempt resets the consecutive-failure count while the breaker is
closed, and changes nothing while it is open or half-open: such an attempt was admitted before the breaker opened
(a slow request that outlived the failures which tripped it), so its success is stale evidence; closing on it
undid the cooldown the provider had just earned and wiped the lease of the trial another request held.

Only the provider's own failures count. A client error (an upstream 4xx other than 401/402/403/404/
407/408/429: the request itself is wrong, e.g. context_length_exceeded) never counts, nor does a reply cut
short by the request's own max_tokens (finish_reason "length"), nor an attempt abandoned because the
client hung up (its trial, if it held one, is given back).

The state lives in a StateStore (hearth.gateway.state): this process by default, Redis when
[gateway].state_url is set, so every worker sees the same cooldowns and the same single trial.
"""

from __future__ import annotations

from hearth.gateway.errors import Cooldown, DeadlineExceeded, InvalidEnvelope, ProviderError, UpstreamStatus, for_log
from hearth.gateway.state import BreakerSnapshot, StateStore, TrialClaim, claim_lease


def counts(error: ProviderError) -> bool:
    """Whether a failed attempt says something about the provider (and so counts toward its breaker): not a
    4xx caused by the request, not a deadline the request itself shortened (DeadlineExceeded.client_set), not a
    reply cut short by the max_tokens the request asked for (InvalidEnvelope.client_capped)."""
    if isinstance(error, DeadlineExceeded) and error.client_set:
        return False
    if isinstance(error, InvalidEnvelope) and error.client_capped:
        return False
    return not (isinstance(error, UpstreamStatus) and error.client_error)


class Breaker:
    """The policy for one provider; the state is in `store` under the provider's name."""

    __slots__ = ("name", "store", "threshold", "cooldown_s", "max_retry_after_s", "trial_lease_s")

    def __init__(self, name: str, store: StateStore, *, threshold: int, cooldown_s: float,
                 max_retry_after_s: float, trial_lease_s: float) -> None:
        self.name = name
        self.store = store
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.max_retry_after_s = max_retry_after_s
        self.trial_lease_s = trial_lease_s

    def skip(self, snap: BreakerSnapshot) -> Cooldown | None:
        """A Cooldown when the snapshot says skip the provider now (open, or its trial is taken)."""
        if snap.open_left_s > 0:
            return Cooldown(self.name, snap.open_left_s, snap.why, snap.status)
        if snap.tripped and snap.trial:
            return Cooldown(self.name, 0.0, "half-open: one trial request is in flight")
        return None

    async def trial(self, snap: BreakerSnapshot) -> tuple[str | None, Cooldown | None]:
        """(trial token, None) when the attempt may go (a token only for a tripped breaker's one trial), else (None,
        the Cooldown that says why not: the breaker is open again, or another request holds the trial), as the
        claim's one atomic step in the store found it."""
        if not snap.tripped:
            return None, None

        async def give_back(claim: TrialClaim) -> None:
            if claim.token is not None:
                await self.store.release_trial(self.name, claim.token)

        # a request cancelled (its client hung up) while the claim is on its way gives the trial back: a trial nobody
        # runs made every request skip the provider for trial_lease_s
        claim = await claim_lease(self.store.try_trial(self.name, self.trial_lease_s), give_back,
                                  f"the trial of {self.name}")
        if claim.token is not None:
            return claim.token, None
        if claim.open_left_s > 0:  # another worker's trial failed after this request read the breaker half-open
            return None, Cooldown(self.name, claim.open_left_s, claim.why, claim.status)
        return None, self.skip(BreakerSnapshot(tripped=True, trial=True))

    async def failure(self, error: ProviderError, trial: str | None) -> bool:
        """Record a failed attempt; True when this opened the breaker. Client errors only give the trial back."""
        if not counts(error):
            if trial is not None:
                await self.store.release_trial(self.name, trial)
            return False
        open_s = status = trial_why = None
        # a Retry-After that comes to 0 s (its "0", a date past, max_retry_after_s = 0) opens no window of its own:
        # the failure still counts toward breaker_failures (returning "not opened" here skipped that rule, and a
        # provider failing every request so was never cooled down)
        if isinstance(error, UpstreamStatus) and error.retry_after is not None and \
                min(error.retry_after, self.max_retry_after_s) > 0:
            open_s, status = min(error.retry_after, self.max_retry_after_s), error.status
            why = f"Retry-After {error.retry_after:g} s (HTTP {error.status})"
        else:
            # the store tells which: a trial token whose lease expired (or whose breaker another trial closed) makes
            # an ordinary failure, that opens the breaker only at the threshold
            why = f"{self.threshold} consecutive failures, last: {for_log(error)}"
            if trial:
                trial_why = f"the half-open trial failed, last: {for_log(error)}"
        return await self.store.failure(self.name, threshold=self.threshold, cooldown_s=self.cooldown_s, open_s=open_s,
                                        why=why, status=status, trial=trial, trial_why=trial_why)

    async def success(self, trial: str | None) -> bool:
        """Record a successful attempt (`trial`: its trial token, or None); True when the breaker is closed now.
        Only the trial's success closes a tripped breaker; any other resets the count only while it is closed."""
        return await self.store.success(self.name, trial)

    def state(self, snap: BreakerSnapshot) -> dict:
        is_open = snap.open_left_s > 0
        state = "open" if is_open else ("half_open" if snap.tripped else "closed")
        return {"state": state, "consecutive_failures": snap.failures,
                "cooldown_left_s": round(snap.open_left_s, 3) if is_open else 0.0,
                "why": snap.why if is_open else None, "trial_in_flight": snap.trial}
