"""The --report file survives a power cut whole: its temporary (mkstemp, a name of this run's own, so two runs
writing one report never share one) is flushed to the disk before it is renamed over the report, and the folder
after. Was: written and renamed with no fsync, so after a host crash the new name could be on the disk and its
data not: an empty or torn report.json in place of the run's (or the previous) report."""

from __future__ import annotations

import os

from hearth.evals.runner import main
from tests.evals.test_eval_runner import valid_reply
from tests.fakes.openai_server import Behavior, FakeOpenAI


def test_the_report_is_flushed_before_its_rename_and_the_folder_after(tmp_path, disk_events):
    report = tmp_path / "out" / "r.json"
    events = disk_events
    with FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))) as server:
        assert main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report) == 0
    renames = [e for e in events if e[0] == "replace" and e[2] == str(report)]
    assert len(renames) == 1, events
    rename = events.index(renames[0])
    temporary = renames[0][1]
    assert os.path.basename(temporary).startswith(".r.json.") and temporary.endswith(".tmp"), "a temporary of its own"
    assert ("fsync", temporary) in events[:rename], "the report's temporary was not fsynced before the rename"
    assert ("fsync", str(report.parent)) in events[rename:], "the report's folder was not fsynced after the rename"
    assert [p.name for p in report.parent.iterdir()] == ["r.json"], "no temporary left behind"
