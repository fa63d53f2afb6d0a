"""The report gets the permissions any file the user writes gets (0666 less the umask: 0644 under umask 022), as
it did before it was written through a temporary. Was: the temporary comes from tempfile.mkstemp, which creates
it 0600, and os.replace kept that mode: every report (and every report rewritten over a 0644 one) was readable by
its owner alone, so a CI job or a teammate reading the shared report got 'Permission denied'."""

from __future__ import annotations

import os
import stat

from hearth.evals.runner import main
from tests.evals.test_eval_runner import valid_reply
from tests.fakes.openai_server import Behavior, FakeOpenAI


def test_the_report_is_written_with_the_users_umask(tmp_path):
    report = tmp_path / "r.json"
    old = os.umask(0o022)
    try:
        with FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))) as server:
            assert main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report) == 0
            assert stat.S_IMODE(report.stat().st_mode) == 0o644
            os.umask(0o002)  # a second run over the first report: the umask of that run
            assert main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report) == 0
            assert stat.S_IMODE(report.stat().st_mode) == 0o664
    finally:
        os.umask(old)
    assert not [p for p in tmp_path.iterdir() if p.name != "r.json"], "no temporary left behind"
