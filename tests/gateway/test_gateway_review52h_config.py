"""Review 52h: the warm-up back-off's settings (warm.warmup_backoff_s, warm.warmup_backoff_max_s) are checked at
start-up, each error naming the setting; the example file sets them."""

from pathlib import Path

import pytest

from hearth.gateway.config import ConfigError, config_from_dict, load_config

FT = {"name": "ft", "base_url": "http://127.0.0.1:9/v1", "model": "m", "scale_to_zero": True,
      "health_url": "http://127.0.0.1:9/health"}
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "gateway.example.toml"


@pytest.mark.parametrize("warm, field, words", [
    ({"warmup_backoff_s": 0}, "providers[0].warm.warmup_backoff_s", "greater than 0"),
    ({"warmup_backoff_s": -5.0}, "providers[0].warm.warmup_backoff_s", "greater than 0"),
    ({"warmup_backoff_s": float("inf")}, "providers[0].warm.warmup_backoff_s", "finite"),
    ({"warmup_backoff_max_s": 0}, "providers[0].warm.warmup_backoff_max_s", "greater than 0"),
    ({"warmup_backoff_max_s": float("nan")}, "providers[0].warm.warmup_backoff_max_s", "finite"),
    ({"warmup_backoff_s": 120.0, "warmup_backoff_max_s": 60.0}, "providers[0].warm.warmup_backoff_max_s",
     "warmup_backoff_s"),
    ({"warmup_backoff_s": 1000.0}, "providers[0].warm.warmup_backoff_max_s", "warmup_backoff_s"),  # > default cap
])
def test_backoff_settings_that_cannot_work_are_start_up_errors_naming_them(warm, field, words):
    with pytest.raises(ConfigError) as info:
        config_from_dict({"providers": [{**FT, "warm": warm}]}, {})
    assert info.value.field == field, str(info.value)
    assert words in str(info.value), str(info.value)


def test_backoff_defaults_and_values_at_the_limits_load():
    cfg = config_from_dict({"providers": [FT, {**FT, "name": "b", "health_url": "http://127.0.0.1:8/health",
                                               "warm": {"warmup_backoff_s": 30.0, "warmup_backoff_max_s": 30.0}}]}, {})
    a, b = cfg.providers
    assert (a.warm.warmup_backoff_s, a.warm.warmup_backoff_max_s) == (60.0, 900.0)
    assert (b.warm.warmup_backoff_s, b.warm.warmup_backoff_max_s) == (30.0, 30.0)   # a fixed back-off: max == start


def test_the_example_sets_the_backoff():
    env = {"HEARTH_VLLM_URL": "http://127.0.0.1:9", "HEARTH_VLLM_API_KEY": "k", "DASHSCOPE_API_KEY": "k",
           "OPENAI_API_KEY": "k"}
    ft = load_config(EXAMPLE, env).provider("finetune")
    assert {"warmup_backoff_s", "warmup_backoff_max_s"} <= ft.warm.model_fields_set
