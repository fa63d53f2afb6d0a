"""A fake OpenAI-compatible endpoint with a realistic mix of replies, for demonstrating `hearth eval`.

    python -m tests.evals.fake_eval_server [--port PORT] [--seconds 120]

--port: where it listens on 127.0.0.1; the default is a free port picked at start (docs/eval.md and
README.md pass `--port 8123` explicitly, for a fixed URL). Prints its base URL as JSON ({"base_url": ...}),
then answers every eval case from the case's own kind: mostly clean envelopes, some wrapped (code fence,
empty think block) which repair strips, and a few failures chosen by a hash of the prompt (a truncated
reply, a 500, prose instead of JSON), so a run is repeatable.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

from hearth.envelope import AnalystReading, ChatReply, FeedComment, dumps
from tests.fakes.openai_server import Behavior, FakeOpenAI


def _reply_for(body: dict) -> Behavior:
    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    bucket = int(hashlib.sha256((system + user).encode()).hexdigest(), 16) % 20
    if '"analyst"' in system:
        analyst = system.split('The "analyst" field must be exactly "')[1].split('"')[0]
        good = dumps(AnalystReading(analyst=analyst, reading="Reading through my lens.", advice="One step.", risk="medium"))
    elif '"comment"' in system:
        good = dumps(FeedComment(comment="Love this.", tone="warm"))
    else:
        good = dumps(ChatReply(message="I'm listening.", mood="calm", memories=[], affection=0, trust=0,
                               suggested_actions=[]))
    if bucket == 0:
        return Behavior.reply(good[: len(good) // 2], finish_reason="length")
    if bucket == 1:
        return Behavior.status(500)
    if bucket == 2:
        return Behavior.reply("Sounds like a lot. Want to talk it through?")
    if bucket in (3, 4, 5):
        return Behavior.reply(f"```json\n{good}\n```")
    if bucket in (6, 7):
        return Behavior.reply(f"<think>\n\n</think>\n\n{good}")
    return Behavior.reply(good, delay_s=0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free port)")
    parser.add_argument("--seconds", type=float, default=120.0, help="stop after this long")
    args = parser.parse_args()
    server = FakeOpenAI(_reply_for, port=args.port).start_in_thread()
    print(json.dumps({"base_url": server.base_url}), flush=True)
    try:
        time.sleep(args.seconds)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
