"""Gateway config: the example loads, and every mistake is a ConfigError naming the field."""

from pathlib import Path

import pytest

from hearth.gateway.config import ConfigError, config_from_dict, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "gateway.example.toml"
ENV = {"HEARTH_VLLM_URL": "http://10.0.0.5:8000", "HEARTH_VLLM_API_KEY": "k1", "DASHSCOPE_API_KEY": "k2",
       "OPENAI_API_KEY": "k3"}


def _one(**overrides) -> dict:
    p = {"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    p.update(overrides)
    return {"providers": [p]}


def test_example_config_loads():
    cfg = load_config(EXAMPLE, env=ENV)
    ft, qwen, openai = cfg.providers
    assert ft.base_url == "http://10.0.0.5:8000/v1" and ft.health_url == "http://10.0.0.5:8000/health"
    assert ft.scale_to_zero and ft.json_schema and ft.api_key == "k1"
    assert ft.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    assert qwen.extra_body == {"enable_thinking": False} and qwen.api_key == "k2"
    assert openai.chat_url == "https://api.openai.com/v1/chat/completions"
    assert cfg.gateway.deadline_s == 30.0 and ft.timeouts.first_token_s == 8.0


@pytest.mark.parametrize("missing", ["DASHSCOPE_API_KEY", "HEARTH_VLLM_URL"])
def test_missing_environment_variable_is_named(missing):
    env = {k: v for k, v in ENV.items() if k != missing}
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, env=env)
    assert missing in str(info.value)
    assert info.value.field in ("providers[1].api_key_env", "providers[0].base_url")


@pytest.mark.parametrize("data, field, words", [
    (_one(timeouts={"first_token_s": 5, "total_s": 1}), "providers[0].timeouts", "first_token_s"),
    (_one(timeouts={"total_s": -1}), "providers[0].timeouts.total_s", "greater than 0"),
    (_one(scale_to_zero=True), "providers[0].health_url", "scale_to_zero"),
    (_one(base_url="localhost:8000"), "providers[0].base_url", "http"),
    (_one(name="has space"), "providers[0].name", "letters"),
    (_one(extra_body={"stream": True}), "providers[0].extra_body", "stream"),
    (_one(temprature=0.1), "providers[0].temprature", "Extra inputs"),
    (_one(api_key="sk-in-file"), "providers[0].api_key", "environment variable"),
    ({"providers": []}, "providers", "at least 1"),
    ({"gateway": {"deadline_s": 0}, **_one()}, "gateway.deadline_s", "greater than 0"),
    ({"gateway": {"default_kind": "poem"}, **_one()}, "gateway.default_kind", "chat"),
    ({"providers": _one()["providers"] * 2}, "providers[1].name", "duplicate provider name 'a'"),
    # TOML has dates; a date in extra_body cannot be sent as JSON: refuse at start-up, not per request
    (_one(extra_body={"since": __import__("datetime").date(2024, 1, 2)}), "providers[0].extra_body", "JSON"),
    # issue 13 item 7: ports out of range or not numbers, and a connect budget over the total one
    (_one(base_url="http://127.0.0.1:99999/v1"), "providers[0].base_url", "out of range"),
    (_one(base_url="http://127.0.0.1:abc/v1"), "providers[0].base_url", "not a valid URL"),
    (_one(base_url="http://127.0.0.1:0/v1"), "providers[0].base_url", "1-65535"),
    (_one(scale_to_zero=True, health_url="http://h:70000/health"), "providers[0].health_url", "out of range"),
    (_one(timeouts={"connect_s": 5, "first_token_s": 1, "total_s": 2}), "providers[0].timeouts", "connect_s must be <= total_s"),
    ({"gateway": {"state_url": "http://127.0.0.1:6379"}, **_one()}, "gateway.state_url", "redis"),
    ({"gateway": {"state_url": "redis://127.0.0.1:99999/0"}, **_one()}, "gateway.state_url", "out of range"),
    ({"gateway": {"state_url": "redis://127.0.0.1:6379/zero"}, **_one()}, "gateway.state_url", "database number"),
    ({"gateway": {"state_prefix": "has space"}, **_one()}, "gateway.state_prefix", "pattern"),
])
def test_errors_name_the_field(data, field, words):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, {})
    assert info.value.field == field
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)


def test_other_tables_ignored_and_expansion_everywhere():
    data = {"app": {"secret": "${NOT_SET}"}, **_one(headers={"X-Team": "${TEAM}"}, model="${MODEL}")}
    cfg = config_from_dict(data, {"TEAM": "hearth", "MODEL": "qwen3"})
    assert cfg.providers[0].headers == {"X-Team": "hearth"} and cfg.providers[0].model == "qwen3"


def test_unreadable_and_invalid_toml(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml", env={})
    assert info.value.field == "config" and "nope.toml" in str(info.value)
    bad = tmp_path / "bad.toml"
    bad.write_text("[[providers]\nname = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    with pytest.raises(ConfigError, match="HEARTH_GATEWAY_CONFIG"):
        load_config(None, env={})
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('[[providers]]\nname = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="UTF-8") as info:
        load_config(latin1, env={})
    assert info.value.field == "config"


def test_toml_datetime_in_extra_body_is_refused_at_load(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text('[[providers]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
                    'extra_body = { since = 2024-01-02T03:04:05Z }\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.field == "providers[0].extra_body"


def test_api_key_not_in_repr():
    cfg = config_from_dict(_one(api_key_env="K"), {"K": "sk-secret"})
    assert cfg.providers[0].api_key == "sk-secret"
    assert "sk-secret" not in repr(cfg) and "sk-secret" not in cfg.model_dump_json()


def test_state_url_accepted_and_default_is_in_process():
    assert config_from_dict(_one(), {}).gateway.state_url is None
    cfg = config_from_dict({"gateway": {"state_url": "redis://127.0.0.1:6379/2", "state_prefix": "gw:a"}, **_one()}, {})
    assert cfg.gateway.state_url == "redis://127.0.0.1:6379/2" and cfg.gateway.state_prefix == "gw:a"
