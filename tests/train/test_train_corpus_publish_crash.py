"""`hearth corpus build` replaces OUT_DIR's three files (train.jsonl, rejected.jsonl, stats.json) as one set.

Was: each file was written to NAME.tmp and renamed into place one after the other, so a build killed between the
renames left the new train.jsonl beside the previous build's rejected.jsonl and stats.json (or, killed later, the
new train.jsonl and rejected.jsonl beside the old stats.json), and `hearth train --corpus OUT_DIR/train.jsonl`
took the folder as it was: stats.json (the counts, the lengths, the tokenizer and settings it was built with) then
described another corpus than the one trained on.

Now the build writes the set into OUT_DIR/.corpus.tmp and publishes it as the final adapter is published
(hearth.train.durable.publish_corpus: the rename to OUT_DIR/.corpus.new is the commit; the old set's files are
moved aside with train.jsonl first, the new ones moved in with train.jsonl last). Killed anywhere, OUT_DIR holds the
whole old set, the whole new set, or no train.jsonl, and `hearth train` refuses a folder whose build a crash
interrupted after its commit, naming the folder and what to do; the next build completes it first.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hearth.train import corpus as C
from hearth.train import durable
from hearth.train.batches import load_examples
from hearth.train.finetune import FinetuneConfig
from tests.train.envelope_tokenizer import build_tokenizer

EXAMPLE = Path(C.TEMPLATE_PATH).with_name("example_corpus.jsonl")


class Crash(BaseException):
    """A kill: not an OSError the build could turn into its own error."""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Two inputs whose builds differ in every file: the old one is the example's first 4 conversations, the new
    one all 12, plus a line that is rejected; and a tokenizer, so train.jsonl is what `hearth train` reads."""
    root = tmp_path_factory.mktemp("inputs")
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    old, new = root / "old.jsonl", root / "new.jsonl"
    old.write_text("\n".join(lines[:4]) + "\n", encoding="utf-8")
    new.write_text("\n".join(lines) + "\n{not json\n", encoding="utf-8")
    examples = C.read_corpus(lines).examples
    tok = build_tokenizer(root / "tok", [e.rendered.text for e in examples])
    model = root / "model"
    model.mkdir()
    return old, new, tok, model


def _snapshot(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in C.BUILD_FILES if (out / name).exists()}


def _reference(tmp_path: Path, inputs) -> tuple[dict, dict]:
    old, new, tok, _ = inputs
    a, b = tmp_path / "ref_old", tmp_path / "ref_new"
    C.build(old, a, tok)
    C.build(new, b, tok)
    want_old, want_new = _snapshot(a), _snapshot(b)
    # the two builds differ in every file, so any mix of them is told apart
    assert all(want_old[name] != want_new[name] for name in C.BUILD_FILES)
    # stats.json names the input it was built from: a build is reproducible byte for byte only into one folder
    return want_old, want_new


def _consumer_accepts(out: Path, model: Path) -> bool:
    """What `hearth train --corpus OUT/train.jsonl` checks before it trains (FinetuneConfig.check, then reading the
    examples): True when it would train on the folder."""
    try:
        FinetuneConfig(corpus=out / "train.jsonl", model=model, out=out.parent / "run").check()
        load_examples(out / "train.jsonl", 4096)
    except ValueError:
        return False
    return True


def _stats_describe_train(out: Path) -> bool:
    """stats.json's counts are those of the train.jsonl and rejected.jsonl beside it."""
    try:
        stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
        rows = (out / "train.jsonl").read_text(encoding="utf-8").splitlines()
        rejected = (out / "rejected.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return False
    return stats["examples"] == len(rows) and stats["rejected"] == len(rejected)


def _seen(out: Path, model: Path) -> tuple[dict, bool, bool]:
    """What OUT holds, whether hearth train accepts it, and whether its stats.json describes its train.jsonl."""
    return _snapshot(out), _consumer_accepts(out, model), _stats_describe_train(out)


class Ops:
    """Counts the file operations a build's publish makes (os.replace, Path.rename, shutil.rmtree, Path.rmdir) and
    raises Crash at the ``crash_at``-th."""

    def __init__(self, mp, crash_at: int | None):
        self.n, self.crash_at = 0, crash_at
        real_replace, real_rename, real_rmtree, real_rmdir = os.replace, Path.rename, shutil.rmtree, Path.rmdir
        ops = self

        def step():
            ops.n += 1
            if ops.crash_at is not None and ops.n == ops.crash_at:
                raise Crash(ops.n)

        def replace(a, b, *args, **kw):
            step()
            return real_replace(a, b, *args, **kw)

        def rename(self_, target):
            step()
            return real_rename(self_, target)

        def rmtree(p, *args, **kw):
            step()
            return real_rmtree(p, *args, **kw)

        def rmdir(self_):
            step()
            return real_rmdir(self_)

        mp.setattr(os, "replace", replace)
        mp.setattr(Path, "rename", rename)
        mp.setattr(shutil, "rmtree", rmtree)
        mp.setattr(Path, "rmdir", rmdir)


def test_a_build_killed_after_its_first_rename_leaves_no_mixed_set_that_train_accepts(tmp_path, monkeypatch, inputs):
    """The weakness as it was: killed right after train.jsonl took its name, OUT held the new train.jsonl beside the
    old rejected.jsonl and stats.json, and `hearth train` accepted it."""
    old, new, tok, model = inputs
    want_old, want_new = _reference(tmp_path, inputs)
    out = tmp_path / "out"
    C.build(old, out, tok)
    real_replace = os.replace
    published: list[str] = []

    def replace_then_crash(src, dst, *args, **kw):
        if Path(dst).parent == out and Path(dst).name in C.BUILD_FILES:
            if published:  # the second of the build's files to take its name in OUT: killed before it does
                raise Crash(dst)
            published.append(Path(dst).name)
        return real_replace(src, dst, *args, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(os, "replace", replace_then_crash)
        with pytest.raises(Crash):
            C.build(new, out, tok)
    held = _snapshot(out)
    mixed = held not in (want_old, want_new) and "train.jsonl" in held
    accepted = _consumer_accepts(out, model)
    assert not (mixed and accepted), (
        f"OUT holds {sorted(n + (' (new)' if held[n] == want_new[n] else ' (old)') for n in held)}, "
        "and hearth train accepts it")
    if not accepted:  # refused: naming the folder and what to do
        with pytest.raises(ValueError, match=r"hearth corpus build"):
            FinetuneConfig(corpus=out / "train.jsonl", model=model, out=tmp_path / "run").check()
    # the next build completes the interrupted one, then publishes its own
    C.build(new, out, tok)
    assert _snapshot(out) == want_new and _consumer_accepts(out, model)
    assert sorted(p.name for p in out.iterdir()) == sorted(C.BUILD_FILES)


def test_killed_at_any_file_operation_train_sees_the_whole_old_set_the_whole_new_one_or_refuses(
        tmp_path, monkeypatch, inputs):
    old, new, tok, model = inputs
    want_old, want_new = _reference(tmp_path, inputs)
    loaded = C.load_tokenizer(tok)  # loaded once: the sweep builds a few hundred times
    monkeypatch.setattr(C, "load_tokenizer", lambda path: loaded)
    with monkeypatch.context() as mp:
        counter = Ops(mp, None)
        out = tmp_path / "count"
        C.build(old, out, tok)
        counter.n = 0
        C.build(new, out, tok)
    total = counter.n
    assert total >= 3, total
    problems = []
    for first in range(1, total + 1):
        for second in (None, 1, 2, 3, 4, 5, 6):  # the recovery (the next build) killed too
            out = tmp_path / f"c{first}_{second}"
            C.build(old, out, tok)
            with monkeypatch.context() as mp:
                Ops(mp, first)
                try:
                    C.build(new, out, tok)
                except Crash:
                    pass
            seen = [_seen(out, model)]
            if second is not None:
                with monkeypatch.context() as mp:
                    Ops(mp, second)
                    try:
                        C.build(new, out, tok)
                    except Crash:
                        pass
                seen.append(_seen(out, model))
            for held, accepted, consistent in seen:
                if accepted and (held not in (want_old, want_new) or not consistent):
                    problems.append((first, second, "hearth train accepts a mixed set",
                                     sorted(n + (" (new)" if held[n] == want_new[n] else " (old)") for n in held)))
            C.build(new, out, tok)  # uninterrupted: the new set, whole, and nothing else
            if _snapshot(out) != want_new or sorted(p.name for p in out.iterdir()) != sorted(C.BUILD_FILES) \
                    or not _consumer_accepts(out, model):
                problems.append((first, second, "final", sorted(p.name for p in out.iterdir())))
    assert not problems, problems[:5]


def test_train_refuses_a_folder_whose_publish_was_interrupted_naming_it(tmp_path, inputs):
    old, new, tok, model = inputs
    out = tmp_path / "out"
    C.build(old, out, tok)
    # committed (renamed to .corpus.new), nothing moved yet: the old set is whole, but the build that the user
    # ran did not finish; hearth train says so rather than train on the set the user replaced
    staged = tmp_path / "staged"
    C.build(new, staged, tok)
    shutil.copytree(staged, out / durable.CORPUS_NEW)
    with pytest.raises(ValueError) as err:
        FinetuneConfig(corpus=out / "train.jsonl", model=model, out=tmp_path / "run").check()
    message = str(err.value)
    assert message.startswith("corpus: ") and str(out) in message and "hearth corpus build" in message
    # an eval corpus is checked the same way
    other = tmp_path / "other"
    C.build(old, other, tok)
    with pytest.raises(ValueError, match=r"^eval_corpus: "):
        FinetuneConfig(corpus=other / "train.jsonl", eval_corpus=out / "train.jsonl", model=model,
                       out=tmp_path / "run").check()
    # an uncommitted .corpus.tmp (a build killed while writing) leaves the old set, which train takes
    shutil.rmtree(out / durable.CORPUS_NEW)
    (out / durable.CORPUS_TMP).mkdir()
    (out / durable.CORPUS_TMP / "train.jsonl").write_text("half", encoding="utf-8")
    assert _consumer_accepts(out, model)
    C.build(new, out, tok)  # and the next build discards it
    assert sorted(p.name for p in out.iterdir()) == sorted(C.BUILD_FILES)
