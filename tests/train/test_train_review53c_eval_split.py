"""Review 53c: --eval-fraction holds out whole conversations. The corpus builder writes one example per assistant
turn, named ID#TURN; the split drew single examples, so the turns of one conversation landed on both sides and the
eval loss was measured on turns whose context (the earlier turns, the persona, the memories) had been trained on.
The split now groups examples by conversation (the id without its #TURN; a row without an id is its own group),
holds out about ``fraction`` of the examples as whole groups, the same ones for a seed in every process, and refuses
a corpus of one conversation naming eval_fraction. A checkpoint saved under the per-example split resumes with it
(its step plan indexes that training set)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from hearth.train import batches, finetune
from hearth.train.batches import Example, split_eval
from tests.train.tiny import run_config, write_corpus

ROOT = Path(__file__).resolve().parents[2]


def conversations(sizes: list[int]) -> list[Example]:
    """Examples as `hearth corpus build` names them: conversation k's assistant turns are conv-k#1, conv-k#3, ..."""
    out = []
    for k, n in enumerate(sizes):
        for t in range(n):
            out.append(Example([1, 2, 3], [-100, 2, 3], line=len(out) + 1, id=f"conv-{k}#{2 * t + 1}"))
    return out


def convs(examples: list[Example]) -> set[str]:
    return {e.id.rsplit("#", 1)[0] for e in examples}


SIZES = [1, 4, 2, 6, 3, 1, 5, 2, 8, 3, 1, 2, 4, 7, 2, 3, 1, 6, 2, 5]  # 20 conversations, 68 examples


def test_no_conversation_is_on_both_sides_of_the_split():
    examples = conversations(SIZES)
    for seed in range(20):
        train, held = split_eval(examples, 0.2, seed)
        assert held and train and len(train) + len(held) == len(examples)
        assert not convs(train) & convs(held), f"seed {seed}: a conversation on both sides"
        assert convs(train) | convs(held) == convs(examples)


def test_about_the_fraction_is_held_out_in_whole_conversations():
    examples = conversations(SIZES)
    for fraction in (0.05, 0.1, 0.2, 0.3, 0.5):
        for seed in range(10):
            train, held = split_eval(examples, fraction, seed)
            whole = {c: sum(1 for e in examples if e.id.startswith(c + "#")) for c in convs(held)}
            assert sum(whole.values()) == len(held), "held out a part of a conversation"
            assert _off_by_less_than_half_a_conversation(examples, fraction, seed), (fraction, seed, len(held))
    # file order kept on both sides (the step plan and the eval read them in corpus order)
    train, held = split_eval(examples, 0.2, 0)
    assert [e.line for e in train] == sorted(e.line for e in train)
    assert [e.line for e in held] == sorted(e.line for e in held)


def _off_by_less_than_half_a_conversation(examples, fraction, seed):
    """The eval count's distance from round(fraction x examples): short, by at most half the smallest conversation
    left to train on (a longer one would have come nearer); long, by less than half the longest one held out."""
    train, held = split_eval(examples, fraction, seed)
    target = max(1, round(len(examples) * fraction))
    size = {}
    for e in examples:
        size[batches.conversation_of(e)] = size.get(batches.conversation_of(e), 0) + 1
    if len(held) < target:
        return target - len(held) <= min(size[batches.conversation_of(e)] for e in train) / 2
    return len(held) - target < max(size[batches.conversation_of(e)] for e in held) / 2 or len(held) == target


def test_a_long_conversation_drawn_early_neither_swells_nor_starves_the_split():
    """Review 53e: the split stopped at the first conversation drawn that would overshoot, and always took the first
    one drawn: one 10-turn conversation among ten single ones, 5 of 20 asked for, held out 10 (drawn first) or
    1 or 2 (drawn second or third) for some seeds; a long-tailed corpus of 769 examples held out 22 to 57 where 38
    were asked for. A conversation that would overshoot is now passed over, and the draw goes on."""
    examples = conversations([10] + [1] * 10)
    assert [len(split_eval(examples, 0.25, seed)[1]) for seed in range(20)] == [5] * 20
    rng = __import__("random").Random(0)
    tailed = conversations([rng.choice([1, 2, 3, 4, 5, 8, 12, 20, 40]) for _ in range(60)])
    for fraction in (0.05, 0.1, 0.2):
        for seed in range(20):
            assert _off_by_less_than_half_a_conversation(tailed, fraction, seed), (fraction, seed)
    # every conversation longer than twice the target: the one nearest it, at least one, never all
    for seed in range(6):
        train, held = split_eval(conversations([6, 9, 4, 7]), 0.1, seed)
        assert len(held) == 4 and len(train) == 22


def test_the_split_of_a_checkpoint_saved_by_the_first_conversation_split_is_kept():
    """Checkpoints written between review 53c and 53e recorded eval_split "conversations" (the split that stopped at
    the first overshoot): their step plans index that training set, so they resume with it; a fresh run records
    "conversations-fill"."""
    examples = conversations(SIZES)
    # as review 53c's hearth held them out (computed with it)
    before = {0: ["conv-4", "conv-9", "conv-15", "conv-17"], 1: ["conv-8", "conv-12", "conv-16"],
              2: ["conv-1", "conv-14", "conv-19"], 3: ["conv-6", "conv-12", "conv-13"]}
    for seed, held in before.items():
        assert sorted(convs(split_eval(examples, 0.2, seed, split="conversations")[1])) == sorted(held)
    assert finetune.eval_split_of({"data": {"eval_split": "conversations"}}, Path("ck")) == "conversations"
    assert finetune.eval_split_of(None, None) == batches.EVAL_SPLIT == "conversations-fill"
    with pytest.raises(ValueError, match=r"^split must be one of \('conversations-fill', 'conversations', "
                                         r"'examples'\), got 'speakers'$"):
        split_eval(examples, 0.2, 0, split="speakers")


def test_the_split_is_the_same_for_a_seed_in_every_process():
    """A resume (and every rank of a torchrun) splits again in its own process: the held-out conversations may not
    depend on the process (str hashes differ with PYTHONHASHSEED), only on the seed."""
    examples = conversations(SIZES)
    mine = {seed: sorted(convs(split_eval(examples, 0.2, seed)[1])) for seed in range(4)}
    assert len({tuple(v) for v in mine.values()}) > 1  # the seed picks them
    code = ("import json, sys; from tests.train.test_train_review53c_eval_split import *; "
            "print(json.dumps({s: sorted(convs(split_eval(conversations(SIZES), 0.2, s)[1])) for s in range(4)}))")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {str(s): v for s, v in mine.items()}
    assert all(v and not set(v) & convs(split_eval(examples, 0.2, s)[0]) for s, v in mine.items())


def test_one_conversation_cannot_be_split_and_says_so_naming_eval_fraction():
    with pytest.raises(ValueError, match=r"^eval_fraction: 0.25 of 4 examples leaves none to train on: they are all "
                                         r"one conversation \(conv-0\)"):
        split_eval(conversations([4]), 0.25, 0)
    # as before, a fraction that asks for every example, and a single example
    with pytest.raises(ValueError, match=r"^eval_fraction: 0.9 of 4 examples leaves none to train on$"):
        split_eval(conversations([1, 1, 1, 1]), 0.9, 0)
    with pytest.raises(ValueError, match=r"^eval_fraction: 0.5 of 1 examples leaves none to train on$"):
        split_eval(conversations([1]), 0.5, 0)
    # two conversations: one is held out, the other trained on, whatever the fraction asks for
    for seed in range(6):
        train, held = split_eval(conversations([1, 5]), 0.6, seed)
        assert len(convs(train)) == len(convs(held)) == 1


def test_rows_without_an_id_are_each_their_own_conversation():
    """An older or hand-written train.jsonl may have no ids: each row is its own group (a row is all that is known of
    it). An id without #TURN names its group whole: rows sharing it go together."""
    examples = conversations([4]) + [Example([1, 2], [-100, 2], line=5 + i) for i in range(6)]
    examples += [Example([1, 2], [-100, 2], line=11 + i, id="hand") for i in range(3)]
    examples += [Example([1, 2], [-100, 2], line=14, id=7)]  # not a string: still a name (json allows it)
    split_apart = 0
    for seed in range(30):
        train, held = split_eval(examples, 0.3, seed)
        for name in ("conv-0", "hand"):
            assert not ({e.id for e in train if str(e.id).startswith(name)}
                        and {e.id for e in held if str(e.id).startswith(name)}), f"seed {seed}: {name} split"
        split_apart += bool([e for e in train if e.id is None] and [e for e in held if e.id is None])
    assert split_apart  # id-less rows are not one group
    # a corpus of id-less rows splits as it always did, one example at a time
    plain = [Example([1, 2], [-100, 2], line=i + 1) for i in range(12)]
    train, held = split_eval(plain, 0.25, 0)
    assert len(held) == 3 and len(train) == 9


def test_a_resume_takes_its_split_from_the_checkpoint_and_refuses_one_it_does_not_know():
    assert finetune.eval_split_of(None, None) == "conversations-fill"  # a fresh run
    assert finetune.eval_split_of({"data": {"eval_split": "conversations"}}, Path("ck")) == "conversations"
    for before in ({"data": {"corpus_sha256": "ab"}}, {"data": {}}, {}):  # saved before review 53c
        assert finetune.eval_split_of(before, Path("ck")) == "examples"
    with pytest.raises(ValueError, match=r"^resume: ck held its eval examples out by 'speakers', which this hearth "):
        finetune.eval_split_of({"data": {"eval_split": "speakers"}}, Path("ck"))


# ------------------------------------------------------------------------------------------- the runner
def _conversation_corpus(path: Path, tok) -> Path:
    """The tiny 12-example corpus, its rows renamed as 4 conversations of 3 assistant turns (conv-k#1, #3, #5)."""
    write_corpus(path, tok, range(12))
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    for i, row in enumerate(rows):
        row.update(id=f"conv-{i // 3}#{2 * (i % 3) + 1}", line=i // 3 + 1)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_run_holds_out_whole_conversations_and_says_how_many(tmp_path, tok, base):
    corpus = _conversation_corpus(tmp_path / "train.jsonl", tok)
    out = io.StringIO()
    _, metrics = finetune.train_model(run_config(corpus, base, tmp_path / "o", max_steps=1, eval_fraction=0.25,
                                                 batch_tokens=1024), console=Console(file=out, width=400))
    data = metrics["data"]
    assert (data["train_examples"], data["eval_examples"], data["eval_conversations"]) == (9, 3, 1)
    assert data["eval_split"] == "conversations-fill"
    assert "9 training examples, 3 held out (1 conversation)" in " ".join(out.getvalue().split())


def test_a_checkpoint_saved_under_the_per_example_split_resumes_with_it(tmp_path, tok, base):
    """Its step plan indexes the training examples of THAT split: the resume (and the checkpoints it writes) keep
    it, and say so; a checkpoint of this version resumes with whole conversations."""
    corpus = _conversation_corpus(tmp_path / "train.jsonl", tok)
    kw = dict(max_steps=5, eval_fraction=0.25, eval_every=5, save_every=2, batch_tokens=1024, warmup_steps=1)
    finetune.train_model(run_config(corpus, base, tmp_path / "new", **kw))
    ckpt = tmp_path / "new" / "checkpoints" / "step-000002"
    state = json.loads((ckpt / "state.json").read_text(encoding="utf-8"))
    assert state["data"]["eval_split"] == "conversations-fill"

    examples, _ = batches.load_examples(corpus, 512)
    _, legacy = split_eval(examples, 0.25, 0, split="examples")
    assert len(convs(legacy)) > 1  # the per-example split of this corpus cuts conversations: the test can tell
    del state["data"]["eval_split"]  # as hearth wrote it before review 53c
    (ckpt / "state.json").write_text(json.dumps(state), encoding="utf-8")
    out = io.StringIO()
    _, resumed = finetune.train_model(run_config(corpus, base, tmp_path / "old", resume=ckpt, **kw),
                                      console=Console(file=out, width=400))
    assert "keeps its per-example eval split" in " ".join(out.getvalue().split())
    assert resumed["data"]["eval_split"] == "examples"
    assert resumed["data"]["eval_conversations"] == len(convs(legacy))
    again = json.loads((tmp_path / "old" / "checkpoints" / "step-000004" / "state.json").read_text(encoding="utf-8"))
    assert again["data"]["eval_split"] == "examples"  # and a resume of the resume keeps it too
    # its eval loss is the per-example held-out set's under the adapter it ends with
    import torch
    import transformers
    from peft import PeftModel

    base_model = transformers.AutoModelForCausalLM.from_pretrained(str(base))
    model = PeftModel.from_pretrained(base_model, str(tmp_path / "old"))
    assert finetune.evaluate(model, legacy, run_config(corpus, base, tmp_path), torch.device("cpu")) == pytest.approx(
        resumed["eval_loss"][-1]["eval_loss"], rel=1e-5)
