"""Warm gate: a cold scale-to-zero endpoint is skipped, warmed in the background, then used."""

import asyncio
import logging

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import (
    CHAT_JSON, MARGIN_S, MESSAGES, SLOW_S, SLOW_TIMEOUTS, make_config, steady, stopwatch,
)

GOOD = Behavior.reply(CHAT_JSON)
PROBE_S = 0.1
WARM = {"probe_timeout_s": PROBE_S, "ttl_s": 30.0, "warmup_budget_s": 5.0, "warmup_poll_s": 0.02,
        "warmup_request_timeout_s": 2.0}


def _finetune(port: int, **warm) -> dict:
    return {"name": "ft", "base_url": f"http://127.0.0.1:{port}/v1", "model": "lora", "scale_to_zero": True,
            "health_url": f"http://127.0.0.1:{port}/health", "warm": {**WARM, **warm},
            "timeouts": {"connect_s": 0.5, "first_token_s": 0.3, "total_s": 1.0}}


def test_refusing_cold_endpoint_is_skipped_warmed_then_used():
    async def main():
        port = free_port()
        async with FakeOpenAI(GOOD) as hosted:
            async with Chain(make_config(_finetune(port), steady("hosted", hosted))) as chain:
                gate = chain.gates["ft"]
                with stopwatch() as t:
                    first = await chain.complete(MESSAGES, kind="chat")   # refused: cold, hosted answers
                cold_cost = t()
                assert gate.warming                                    # background warm-up is knocking
                async with FakeOpenAI(GOOD, port=port) as ft:          # the container comes up
                    await gate.wait_warmup()
                    second = await chain.complete(MESSAGES, kind="chat")
                    metrics = chain.metrics.render().decode()
                    return first, cold_cost, second, len(ft.requests), ft.health_calls, metrics

    first, cold_cost, second, ft_calls, health_calls, metrics = asyncio.run(main())
    assert first.provider == "hosted" and first.attempts == [("ft", "cold"), ("hosted", "ok")]
    assert cold_cost < PROBE_S + MARGIN_S                      # nobody waits on the cold fine-tune
    assert second.provider == "ft" and second.attempts == [("ft", "ok")]
    assert ft_calls == 1 and health_calls == 1                 # warm-up's knock; request 2 used the cache
    assert 'hearth_gateway_warm_decisions_total{decision="cold",provider="ft"} 1.0' in metrics
    assert 'hearth_gateway_warm_decisions_total{decision="warm",provider="ft"} 1.0' in metrics
    assert 'hearth_gateway_warmups_total{outcome="ok",provider="ft"} 1.0' in metrics


def test_hanging_cold_endpoint_shares_one_probe_and_serves_after_warmup():
    """A burst of 20 meets a cold endpoint whose health route hangs: one shared probe, cut at probe_timeout_s, and
    every request goes to the hosted model. The warm-up's knock is answered only once the burst is back, so the
    burst provably did not wait on the warm-up (it would deadlock, cut by wait_for), and the fine-tune's own
    timeouts are long, so a probe not cut at probe_timeout_s would cost seconds, far above any load stall (a
    0.35 s bound on the burst failed once on the loaded 2-core CI machine, at 0.98 s)."""
    async def main():
        burst_back = asyncio.Event()

        async def health():
            if ft.health_calls == 1:
                return Behavior.hang()                  # the probe: hangs, cut at probe_timeout_s
            await burst_back.wait()                     # the warm-up's knock: answers after the burst
            return Behavior.raw(b'{"status": "ok"}')

        async with FakeOpenAI(GOOD, health=health) as ft, FakeOpenAI(GOOD) as hosted:
            ft_cfg = {**_finetune(ft.port, warmup_budget_s=60.0, warmup_request_timeout_s=30.0),
                      "timeouts": SLOW_TIMEOUTS}
            async with Chain(make_config(ft_cfg, steady("hosted", hosted))) as chain:
                with stopwatch() as t:
                    burst = await asyncio.wait_for(
                        asyncio.gather(*(chain.complete(MESSAGES, kind="chat") for _ in range(20))), 4 * SLOW_S)
                burst_cost = t()
                burst_back.set()
                await chain.gates["ft"].wait_warmup()
                later = await chain.complete(MESSAGES, kind="chat")
                return burst, burst_cost, later, ft.health_calls, len(ft.requests), (await chain.status())[0]

    burst, burst_cost, later, health_calls, ft_calls, status = asyncio.run(main())
    assert {r.provider for r in burst} == {"hosted"}
    assert all(r.attempts == [("ft", "cold"), ("hosted", "ok")] for r in burst)
    assert burst_cost < SLOW_S / 2                             # one short probe, not the fine-tune's own timeouts
    assert health_calls == 2                                   # one shared probe + one warm-up knock: no stampede
    assert later.provider == "ft" and ft_calls == 1
    assert status["warm_gate"]["warm"] is True and status["warm_gate"]["warming"] is False


def test_warm_gated_provider_goes_first_even_when_listed_later():
    async def main():
        async with FakeOpenAI(GOOD) as ft, FakeOpenAI(GOOD) as hosted:
            cfg = make_config(steady("hosted", hosted), _finetune(ft.port))
            async with Chain(cfg) as chain:
                results = [await chain.complete(MESSAGES, kind="chat") for _ in range(3)]
                return results, ft.health_calls

    results, health_calls = asyncio.run(main())
    assert [r.provider for r in results] == ["ft"] * 3
    assert health_calls == 1                                   # answer cached for ttl_s


def test_failed_warmup_reports_the_providers_last_answer_not_the_budget_cut_wait(caplog):
    """The endpoint answers 503, then stops answering; the last knock's wait is cut short by the warm-up budget
    (0.3 s left of a 2 s request timeout). The failure reports the provider's own last answer (HTTP 503), not
    the shortened wait -- which was also the race that made the 503 assertion below depend on machine load."""
    async def main():
        health = [Behavior.status(503), Behavior.status(503), Behavior.hang(), Behavior.hang()]
        async with FakeOpenAI(GOOD, health=health) as ft, FakeOpenAI(GOOD) as hosted:
            cfg = make_config(_finetune(ft.port, warmup_budget_s=0.3), steady("hosted", hosted))
            async with Chain(cfg) as chain:
                await chain.complete(MESSAGES, kind="chat")
                await chain.gates["ft"].wait_warmup()
                await asyncio.sleep(0)  # let the done-callback run
                return await chain.gates["ft"].state(), ft.health_calls

    with caplog.at_level(logging.ERROR, logger="hearth.gateway.warm"):
        state, calls = asyncio.run(main())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert calls == 3, calls  # the probe's 503, the warm-up's 503, then the knock the budget cut short
    assert errors and "not warm after 0.3 s: health answered HTTP 503" in errors[0], errors
    assert state["warm"] is False and state["last_error"] == "health answered HTTP 503"


def test_failed_warmup_is_logged_and_counted_not_swallowed(caplog):
    async def main():
        async with FakeOpenAI(GOOD, health=Behavior.status(503)) as ft, FakeOpenAI(GOOD) as hosted:
            cfg = make_config(_finetune(ft.port, warmup_budget_s=0.2), steady("hosted", hosted))
            async with Chain(cfg) as chain:
                result = await chain.complete(MESSAGES, kind="chat")
                await chain.gates["ft"].wait_warmup()
                await asyncio.sleep(0)  # let the done-callback run
                return result, chain.metrics.render().decode(), await chain.gates["ft"].state()

    with caplog.at_level(logging.ERROR, logger="hearth.gateway.warm"):
        result, metrics, state = asyncio.run(main())
    assert result.provider == "hosted"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and "warm-warmup-ft" in errors[0].getMessage() and "HTTP 503" in errors[0].getMessage()
    assert 'hearth_gateway_warmups_total{outcome="failed",provider="ft"} 1.0' in metrics
    assert state["warm"] is False and state["last_error"] == "health answered HTTP 503"


def test_aclose_cancels_a_running_warmup():
    async def main():
        async with FakeOpenAI(GOOD, health=Behavior.hang()) as ft, FakeOpenAI(GOOD) as hosted:
            # the knock would wait 30 s and the warm-up 60: a close that waited for either is far past the bound
            ft_cfg = _finetune(ft.port, warmup_budget_s=60.0, warmup_request_timeout_s=30.0)
            chain = Chain(make_config(ft_cfg, steady("hosted", hosted)))
            await chain.start()
            await chain.complete(MESSAGES, kind="chat")
            gate = chain.gates["ft"]
            assert gate.warming
            with stopwatch() as t:
                await chain.aclose()
            return t(), gate.warming

    elapsed, warming = asyncio.run(main())
    assert elapsed < MARGIN_S and warming is False


def test_warm_endpoint_that_goes_away_is_reprobed():
    async def main():
        port = free_port()
        async with FakeOpenAI(GOOD) as hosted:
            async with Chain(make_config(_finetune(port), steady("hosted", hosted))) as chain:
                async with FakeOpenAI(GOOD, port=port):
                    first = await chain.complete(MESSAGES, kind="chat")       # warm: ft answers
                # ft scaled back to zero while its "warm" answer is still cached (ttl 30 s)
                second = await chain.complete(MESSAGES, kind="chat")          # tried, refused, hosted answers
                third = await chain.complete(MESSAGES, kind="chat")           # re-probed: cold, skipped
                return first, second, third

    first, second, third = asyncio.run(main())
    assert first.provider == "ft"
    assert second.attempts == [("ft", "connection"), ("hosted", "ok")]
    assert third.attempts == [("ft", "cold"), ("hosted", "ok")]


def test_two_providers_on_one_endpoint_share_its_warm_state_and_one_warmup():
    # two LoRA adapters a vLLM serves (or one model at two settings) are one scale-to-zero server: each provider
    # had its own gate, so a cold start ran two probes and two warm-ups, and one learning it was warm left the
    # other skipping it as cold
    async def main():
        port = free_port()
        a = {**_finetune(port), "name": "ft-a", "model": "lora-a"}
        b = {**_finetune(port), "name": "ft-b", "model": "lora-b"}
        async with FakeOpenAI(GOOD) as hosted:
            async with Chain(make_config(a, b, steady("hosted", hosted))) as chain:
                assert chain.gates["ft-a"] is chain.gates["ft-b"]
                first = await chain.complete(MESSAGES, kind="chat")   # both cold: hosted answers
                async with FakeOpenAI(GOOD, port=port) as ft:
                    await chain.gates["ft-b"].wait_warmup()
                    second = await chain.complete(MESSAGES, kind="chat", model="lora-b")
                    metrics = chain.metrics.render().decode()
                    return first, second, ft.health_calls, metrics

    first, second, health_calls, metrics = asyncio.run(main())
    assert first.provider == "hosted" and first.attempts == [("ft-a", "cold"), ("ft-b", "cold"), ("hosted", "ok")]
    assert second.provider == "ft-b" and second.attempts == [("ft-b", "ok")]   # warm without a probe of its own
    assert health_calls == 1                                   # one warm-up's knock for the endpoint
    assert 'hearth_gateway_warm_decisions_total{decision="cold",provider="ft-b"} 1.0' in metrics
    assert 'hearth_gateway_warm_decisions_total{decision="warm",provider="ft-b"} 1.0' in metrics
