"""The whole stack on the CPU, every joint real: a tiny random Qwen3 -> `hearth train` (a few steps) ->
`hearth export` -> served by `transformers serve` (a real OpenAI-compatible server, offline, local folder)
-> `hearth eval` completes with a report -> the app (`hearth serve`) whose gateway chain has that server
as its fine-tune provider -> one chat turn reaches the model. Scores are low (random weights): the point
is that every joint holds."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from hearth.cli import app
from tests.fakes.openai_server import PORT_TRIES, free_port, port_taken
from tests.train.tiny import save_tiny_model, tiny_tokenizer, write_corpus

transformers = pytest.importorskip("transformers")
pytest.importorskip("openai")  # transformers serve needs it (transformers[serving])


@contextmanager
def transformers_serve(model_dir: Path, log: Path, ready_s: float = 90.0):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    for attempt in range(PORT_TRIES):
        port = free_port()
        cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; "
               "sys.argv[0] = 'transformers'; sys.exit(main())", "serve", str(model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--device", "cpu", "--dtype", "float32", "--log-level", "info"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_s
            while proc.poll() is None:
                try:
                    if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"transformers serve not ready:\n{log.read_text(errors='replace')}"
                time.sleep(0.2)
        except BaseException:
            proc.kill()
            proc.wait(10)
            raise
        if proc.poll() is None:
            break
        # free when picked, not when the server binds it seconds later (importing transformers): only that clash is
        # tried again
        text = log.read_text(errors="replace")
        assert port_taken(text) and attempt < PORT_TRIES - 1, f"transformers serve exited {proc.returncode}:\n{text}"
    try:
        yield url
    finally:
        proc.kill()
        proc.wait(10)


def served_chats(log: Path) -> int:
    return log.read_text(errors="replace").count('"POST /v1/chat/completions HTTP/1.1" 200')


def test_train_export_serve_eval_gateway_app(tmp_path):
    from transformers import AutoTokenizer

    from hearth.app.crypto import new_master_key_text
    from tests.app.app_client import create_companion, signup
    from tests.app.app_server import hearth_serve

    tok_dir = tiny_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    base = save_tiny_model(tmp_path / "base", len(tok))
    tok.save_pretrained(str(base))  # a downloaded model folder carries its tokenizer
    corpus = write_corpus(tmp_path / "train.jsonl", tok, range(8))
    run = CliRunner()

    result = run.invoke(app, ["train", "--corpus", str(corpus), "--model", str(base), "--out", str(tmp_path / "adapter"),
                              "--max-steps", "3", "--rank", "4", "--lr", "1e-2", "--seq-len", "512", "--no-patch"])
    assert result.exit_code == 0, result.output
    merged = tmp_path / "merged"
    result = run.invoke(app, ["export", "--adapter", str(tmp_path / "adapter"), "--model", str(base), "--out", str(merged)])
    assert result.exit_code == 0, result.output

    log = tmp_path / "serve.log"
    with transformers_serve(merged, log) as url:
        report = tmp_path / "eval.json"
        result = run.invoke(app, ["eval", "feed", "--base-url", f"{url}/v1", "--model", str(merged), "--max-tokens", "4",
                                  "--threshold", "0", "--concurrency", "2", "--timeout", "60", "--seed", "1",
                                  "--report", str(report)])
        assert result.exit_code == 0, result.output
        doc = json.loads(report.read_text())
        assert doc["overall"]["total"] == 15 and len(doc["cases"]) == 15
        assert all(c["status"] == 200 for c in doc["cases"]), [c["reason"] for c in doc["cases"]][:3]
        assert all(c["usage"]["completion_tokens"] <= 4 for c in doc["cases"])  # the server counted its tokens
        assert all(c["ttft_s"] is not None for c in doc["cases"] if c["content"])
        assert served_chats(log) == 15

        cfg = tmp_path / "hearth.toml"
        cfg.write_text(f"""
[gateway]
deadline_s = 60.0

[[providers]]
name = "finetune"
base_url = "{url}/v1"
model = "{merged}"
json_schema = false
# the app sends no max_tokens and transformers serve then generates up to 1024 tokens, which a random-weight model
# fills (no EOS) in minutes on a busy CPU: cap the reply the way an operator caps a provider
extra_body = {{ max_tokens = 8 }}
[providers.timeouts]
connect_s = 2.0
first_token_s = 60.0
total_s = 60.0
""")
        env = {"HEARTH_MASTER_KEY": new_master_key_text()}
        with hearth_serve(tmp_path, "--config", str(cfg), "--database-url", f"sqlite:///{tmp_path / 'app.sqlite3'}",
                          env=env) as hearth:
            async def chat_turn() -> httpx.Response:
                async with httpx.AsyncClient(base_url=hearth.url, timeout=90.0) as client:
                    csrf = await signup(client, "mara")
                    cid = await create_companion(client, csrf)
                    return await client.post(f"/companions/{cid}/messages", data={"message": "hello", "csrf": csrf},
                                             headers={"accept": "text/html"})

            before = served_chats(log)
            response = asyncio.run(chat_turn())
            # the turn went app -> gateway chain -> the fine-tune provider -> the exported model
            assert served_chats(log) > before, hearth.output()[-2000:]
            # random weights do not write envelopes: the app says, in the user's words, that the answer could not be
            # understood and that nothing was saved (class and provider names stay in the logs)
            assert response.status_code == 502, response.text[-1500:]
            assert "could not be understood" in response.text and "Nothing was saved" in response.text, response.text[-1500:]
