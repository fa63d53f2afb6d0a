"""Review 73: `hearth gateway --port` outside 0-65535 is a usage error naming --port (exit 2).

`--port 70000` passed the port check (getaddrinfo takes the number modulo 65536 and the bind succeeded) and then
died in aiohttp's bind with an OverflowError traceback, exit 1; `--port -1` said 'cannot listen on
127.0.0.1:-1: Servname not supported for ai_socktype', exit 1 (as a port in use). `hearth serve` refused both
naming port, exit 2.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hearth.cli import app

PROVIDER = '[[providers]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_a_port_out_of_range_is_exit_2_naming_port(tmp_path, port, monkeypatch):
    import hearth.gateway.server as server

    def no_serve(*a, **k):  # the run must stop before serving
        raise AssertionError("served")

    monkeypatch.setattr(server, "_serve", no_serve)
    monkeypatch.setattr(server, "_supervise", no_serve)
    config = tmp_path / "gw.toml"
    config.write_text(PROVIDER)
    result = CliRunner().invoke(app, ["gateway", "--config", str(config), "--port", port])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "--port" in result.output and "0-65535" in result.output
