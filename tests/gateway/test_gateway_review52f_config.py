"""Review 52f: warm-gate settings that made the scale-to-zero endpoint misbehave are start-up errors naming them.

    * warm.warmup_poll_s = 0 was accepted: a health route that fails fast (404, 500, refused) was knocked on in a
      tight loop for the whole warm-up budget (about 3,000 GETs in 0.5 s on loopback), burning the worker's CPU
      and hammering the endpoint (on a scale-to-zero platform, each knock may start a container);
    * health_url or a [providers.warm] table without scale_to_zero = true was silently ignored: the fine-tune was
      never warm-gated, so every request went to it first, cold or not, and waited out its timeout.
"""

import pytest

from hearth.gateway.config import ConfigError, config_from_dict

FT = {"name": "ft", "base_url": "http://127.0.0.1:9/v1", "model": "m", "scale_to_zero": True,
      "health_url": "http://127.0.0.1:9/health"}


@pytest.mark.parametrize("data, field, words", [
    ({"providers": [{**FT, "warm": {"warmup_poll_s": 0}}]}, "providers[0].warm.warmup_poll_s", "greater than 0"),
    ({"providers": [{**FT, "scale_to_zero": False}]}, "providers[0].health_url", "scale_to_zero = true"),
    ({"providers": [{k: v for k, v in FT.items() if k not in ("scale_to_zero", "health_url")},
                    {**FT, "name": "b", "scale_to_zero": False, "health_url": None, "warm": {"ttl_s": 1.0}}]},
     "providers[1].warm", "scale_to_zero = true"),
])
def test_warm_gate_settings_that_break_it_are_start_up_errors_naming_them(data, field, words):
    with pytest.raises(ConfigError) as info:  # before: accepted
        config_from_dict(data, {})
    assert info.value.field == field, str(info.value)
    assert words in str(info.value)


def test_the_settings_around_those_limits_still_load():
    cfg = config_from_dict({"providers": [{**FT, "warm": {"probe_timeout_s": 0.5, "warmup_poll_s": 0.01, "ttl_s": 0}},
                                          {"name": "hosted", "base_url": "http://127.0.0.1:9/v1", "model": "q"}]}, {})
    assert cfg.providers[0].warm.probe_timeout_s == 0.5 and not cfg.providers[1].scale_to_zero


@pytest.mark.parametrize("key", ["base_url", "health_url"])
def test_an_empty_path_segment_from_a_variable_ending_in_a_slash_is_a_start_up_error(key):
    # HEARTH_VLLM_URL copied with its trailing slash made "${HEARTH_VLLM_URL}/health" a path starting "//": the
    # server's router answered 404, so the fine-tune read cold for good (and every chat request got a 404)
    doc = {"providers": [{**FT, "base_url": "${HEARTH_VLLM_URL}/v1", "health_url": "${HEARTH_VLLM_URL}/health"}]}
    with pytest.raises(ConfigError) as info:  # before: loaded; the probe got HTTP 404 for ever
        config_from_dict(doc, {"HEARTH_VLLM_URL": "http://127.0.0.1:9/"})
    assert info.value.field == "providers[0].base_url"
    ok = {**FT, key: FT[key].replace("127.0.0.1:9/", "127.0.0.1:9//")}
    with pytest.raises(ConfigError) as info:
        config_from_dict({"providers": [ok]}, {})
    assert info.value.field == f"providers[0].{key}" and "'//'" in str(info.value)


def test_a_probe_that_could_outlast_the_request_deadline_is_a_start_up_error():
    # a hanging health route (the endpoint mid cold start) held the request for probe_timeout_s: at or past
    # gateway.deadline_s the whole deadline went to the probe and no provider was tried (seen: deadline 0.4 s,
    # probe 0.5 s, the hosted fallback got no request, every request DeadlineExceeded)
    data = {"gateway": {"deadline_s": 0.4},
            "providers": [{**FT, "warm": {"probe_timeout_s": 0.5}},
                          {"name": "hosted", "base_url": "http://127.0.0.1:9/v1", "model": "q"}]}
    with pytest.raises(ConfigError) as info:  # before: accepted
        config_from_dict(data, {})
    assert info.value.field == "providers[0].warm.probe_timeout_s", str(info.value)
    assert "gateway.deadline_s" in str(info.value)
