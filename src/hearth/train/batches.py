"""Training data for hearth.train.finetune: fitting examples into the sequence length, the validation
split (whole conversations held out: split_eval), per-epoch shuffling, token-budget micro-batches (padded or
packed) and their tensors.

Fitting (fit_example): an example longer than seq_len keeps its system prompt (the first message block)
and its last user turn + trained reply (the last two blocks), and drops the OLDEST history turns, two
at a time (a user turn and the reply to it), until it fits -- the prompt production sends never lacks
its system prompt, and the trained reply is never cut. An example that does not fit even with no
history is rejected with its line number (``rejected`` in the stats), as is a long row without the
``turns`` field (a corpus built before it existed: rebuild it).

Micro-batches (plan_epoch): examples in a per-epoch order (a permutation seeded by seed and epoch, or
file order without shuffling) are grouped greedily so that a micro-batch holds at most batch_tokens
tokens: padded, longest x count <= batch_tokens; packed, the sum of lengths <= batch_tokens, all in
ONE row whose position ids restart at 0 for each example. transformers turns restarting position
ids (with no attention mask) into a block-diagonal causal mask, so no token attends across an example
boundary; the first label of every example is ignored, so no position is trained to predict the next
example's first token (it never was: position 0's label is never a target). grad_accum micro-batches
make one optimizer step, each weighted by its count of trained tokens.

No pydantic, no transformers import here: plain Python plus torch for the tensors.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Example:
    ids: list[int]
    labels: list[int]
    line: int
    id: str | None = None
    dropped_turns: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def targets(self) -> int:
        """Trained tokens: labels[t] is predicted from position t - 1, so position 0 never counts."""
        return sum(1 for x in self.labels[1:] if x != IGNORE_INDEX)


class TooLong(ValueError):
    pass


def fit_example(ids: list[int], labels: list[int], turns: list[int] | None, seq_len: int) -> tuple[list[int], list[int], int]:
    """(ids, labels, history blocks dropped) at most seq_len long; TooLong (reason) when it cannot fit."""
    if len(ids) <= seq_len:
        return ids, labels, 0
    if not turns:
        raise TooLong(f"{len(ids)} tokens > seq_len={seq_len} and no 'turns' to drop history by "
                      "(rebuild the corpus with `hearth corpus build --tokenizer`)")
    bounds = list(turns) + [len(ids)]
    if len(turns) < 3:
        raise TooLong(f"{len(ids)} tokens > seq_len={seq_len} with no history turn to drop")
    keep_head = (0, bounds[1])  # the system prompt block
    tail = (bounds[-3], len(ids))  # the last user turn and the trained reply
    history = [(bounds[i], bounds[i + 1]) for i in range(1, len(bounds) - 3)]
    fixed = (keep_head[1] - keep_head[0]) + (tail[1] - tail[0])
    dropped = 0
    while history and fixed + sum(b - a for a, b in history) > seq_len:
        drop = 2 if len(history) >= 2 else 1
        history, dropped = history[drop:], dropped + drop
    if fixed + sum(b - a for a, b in history) > seq_len:
        raise TooLong(f"system prompt + last user turn + reply = {fixed} tokens > seq_len={seq_len} "
                      "even with every history turn dropped")
    spans = [keep_head, *history, tail]
    return ([t for a, b in spans for t in ids[a:b]], [t for a, b in spans for t in labels[a:b]], dropped)


def _bad_row(ids: list, labels: list, turns) -> str | None:
    """What is wrong with a row's token lists (None: nothing): ids are non-negative ints, labels such ids or
    IGNORE_INDEX, turns (when present) increasing token positions inside the row."""
    if not all(type(x) is int and x >= 0 for x in ids):
        return "input_ids holds something other than non-negative int token ids"
    if not all(type(x) is int and (x >= 0 or x == IGNORE_INDEX) for x in labels):
        return f"labels holds something other than token ids and {IGNORE_INDEX}"
    # labels copy input_ids on the trained tokens (the model shifts them by one itself): a corpus shifted already
    # would train every token off by one
    off = next((t for t, (x, y) in enumerate(zip(ids, labels)) if y != IGNORE_INDEX and y != x), None)
    if off is not None:
        return (f"labels[{off}] = {labels[off]} is neither {IGNORE_INDEX} nor input_ids[{off}] = {ids[off]} "
                "(labels copy the input ids on trained tokens, unshifted)")
    if turns is not None and not (isinstance(turns, list) and all(type(t) is int and 0 <= t < len(ids) for t in turns)
                                  and all(a < b for a, b in zip(turns, turns[1:]))):
        return "turns is not a list of increasing token positions inside the row"
    return None


def load_examples(path: Path, seq_len: int, *, name: str = "corpus") -> tuple[list[Example], dict]:
    """Examples that fit seq_len (history dropped where needed), plus counts and the rejected lines.
    ValueError naming ``name`` for a malformed row, or when nothing is trainable.

    Counts: examples, truncated (examples that lost history to fit), history_turns_dropped (history message blocks
    dropped in all: a user turn and its reply are two), skipped_no_target, longest_tokens (the longest row as the
    corpus holds it, rejected ones included: the seq_len that would keep every example whole) and
    longest_fitted_tokens (the longest example trained on)."""
    examples, rejected, truncated, dropped, skipped, longest = [], [], 0, 0, 0, 0
    with Path(path).open("rb") as fh:  # decoded line by line: a line that is not UTF-8 is named
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{name}: line {lineno} is not UTF-8 ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{name}: line {lineno} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{name}: line {lineno} is not a JSON object (a row of `hearth corpus build "
                                 f"--tokenizer`), got {type(row).__name__}")
            ids, labels = row.get("input_ids"), row.get("labels")
            if not isinstance(ids, list) or not isinstance(labels, list) or len(ids) != len(labels) or not ids:
                raise ValueError(f"{name}: line {lineno} has no input_ids/labels lists of equal, non-zero length "
                                 "(build the corpus with --tokenizer)")
            turns = row.get("turns")
            bad = _bad_row(ids, labels, turns)
            if bad:
                raise ValueError(f"{name}: line {lineno}: {bad} (rebuild the corpus with `hearth corpus build --tokenizer`)")
            longest = max(longest, len(ids))
            try:
                ids, labels, n = fit_example(ids, labels, turns, seq_len)
            except TooLong as why:
                rejected.append({"line": lineno, "id": row.get("id"), "conversation_line": row.get("line"),
                                 "reason": str(why)})
                continue
            truncated, dropped = truncated + bool(n), dropped + n
            example = Example(ids, labels, lineno, row.get("id"), n)
            if example.targets == 0:
                skipped += 1
                continue
            examples.append(example)
    if not examples:
        why = f"; rejected: line {rejected[0]['line']}: {rejected[0]['reason']}" if rejected else ""
        raise ValueError(f"{name}: {path} has no example with a trained token within seq_len={seq_len}{why}")
    return examples, {"examples": len(examples), "truncated": truncated, "history_turns_dropped": dropped,
                      "skipped_no_target": skipped, "longest_tokens": longest,
                      "longest_fitted_tokens": max(len(e) for e in examples), "rejected": rejected}


_TURN = re.compile(r"(.+)#\d+")


def conversation_of(example: Example) -> str | int:
    """The conversation an example was built from, what split_eval groups by: the corpus builder names the example
    of each assistant turn ID#TURN (``wren-exam#3`` -> ``wren-exam``). An id without #TURN (a hand-written row)
    names its group whole, so rows sharing it go together; a row without an id (an older or hand-written
    train.jsonl) is its own group, keyed by its line (an int: never equal to an id)."""
    if example.id is None:
        return example.line
    return conversation_named(example.id if isinstance(example.id, str) else json.dumps(example.id, sort_keys=True))


def conversation_named(name: str) -> str:
    """The conversation an example named ``name`` belongs to (conversation_of): ID of ID#TURN, else the name."""
    turn = _TURN.fullmatch(name)
    return turn.group(1) if turn else name


# How split_eval may hold eval examples out; a checkpoint records the one it was trained with (its step plan indexes
# that training set), and a resume repeats it. The first is what a fresh run uses.
EVAL_SPLITS = ("conversations-fill", "conversations", "examples")
EVAL_SPLIT = EVAL_SPLITS[0]


def split_eval(examples: list[Example], fraction: float, seed: int, *,
               split: str = EVAL_SPLIT) -> tuple[list[Example], list[Example]]:
    """(train, eval), each in corpus order: about ``fraction`` of the examples held out as whole conversations
    (conversation_of), at least one, never all. Holding out single examples put the turns of one conversation on
    both sides, so the eval loss was measured on turns whose earlier turns, persona and memories were trained on.

    The conversations are drawn in a random order from the seed (torch's generator over their order of first
    appearance: the same split in every process, as a resume and every rank need); each one drawn is held out when
    it brings the count nearer round(fraction x examples) and passed over when it would not (the draw goes on, so a
    long conversation drawn early neither swells the eval set nor ends it short). The count is then off by at most
    half a conversation: short, by at most half the smallest one trained on; long, by less than half the longest
    one held out. Where every conversation is longer than twice that target, the one nearest it is held out.

    ``split``, one of EVAL_SPLITS, for the resume of a checkpoint saved by an earlier hearth: "conversations" stopped
    at the first conversation that would overshoot and always took the first one drawn (off by up to a long
    conversation, either way); "examples" holds out single examples. Where every conversation is one example, all
    three are the same split: the same seeded order, as long a prefix."""
    import torch

    if split not in EVAL_SPLITS:
        raise ValueError(f"split must be one of {EVAL_SPLITS}, got {split!r}")
    if fraction <= 0:
        return examples, []
    target = max(1, round(len(examples) * fraction))
    if target >= len(examples):
        raise ValueError(f"eval_fraction: {fraction} of {len(examples)} examples leaves none to train on")
    groups: dict[str | int, list[int]] = {}
    for i, e in enumerate(examples):
        groups.setdefault(i if split == "examples" else conversation_of(e), []).append(i)
    members = list(groups.values())  # in order of first appearance, never of a (process-salted) hash
    if len(members) == 1:
        raise ValueError(f"eval_fraction: {fraction} of {len(examples)} examples leaves none to train on: they are all "
                         f"one conversation ({next(iter(groups))}), and the eval split holds out whole conversations "
                         "(give an eval_corpus instead)")
    order = torch.randperm(len(members), generator=torch.Generator().manual_seed(seed + 7919)).tolist()
    held: set[int] = set()
    if split == "conversations":  # review 53c's: kept for the checkpoints it wrote
        for g in order[:-1]:
            if held and abs(len(held) + len(members[g]) - target) >= abs(len(held) - target):
                break
            held.update(members[g])
    else:
        for g in order:  # "< len(examples)": never all (something is left to train on)
            n = len(held) + len(members[g])
            if n < len(examples) and abs(n - target) < abs(len(held) - target):
                held.update(members[g])
        if not held:  # each is over twice the target: the nearest (the first drawn on a tie); there are >= 2
            held.update(min((members[g] for g in order), key=lambda m: abs(len(m) - target)))
    return [e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held]


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    import torch

    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()


def micro_batches(examples: list[Example], order: list[int], batch_tokens: int, pack: bool) -> list[list[int]]:
    """Greedy grouping of ``order`` into micro-batches of at most batch_tokens tokens (see the module doc)."""
    out: list[list[int]] = []
    current: list[int] = []
    longest = total = 0
    for i in order:
        n = len(examples[i])
        fits = (total + n <= batch_tokens) if pack else (max(longest, n) * (len(current) + 1) <= batch_tokens)
        if current and not fits:
            out.append(current)
            current, longest, total = [], 0, 0
        current.append(i)
        longest, total = max(longest, n), total + n
    if current:
        out.append(current)
    return out


def plan_epoch(examples: list[Example], epoch: int, *, seed: int, shuffle: bool, batch_tokens: int, pack: bool,
               grad_accum: int) -> list[list[list[int]]]:
    """One epoch as optimizer steps, each a list of micro-batches (lists of example indices)."""
    mbs = micro_batches(examples, epoch_order(len(examples), epoch, seed, shuffle), batch_tokens, pack)
    return [mbs[i:i + grad_accum] for i in range(0, len(mbs), grad_accum)]


def collate(batch: list[Example], *, pack: bool, pad_id: int = 0, device=None) -> dict:
    """Model inputs for one micro-batch: padded (input_ids, attention_mask, labels) or one packed row
    (input_ids, position_ids, labels; each example's first label ignored; and the row's sequence offsets as
    transformers' varlen kwargs: cu_seq_lens_q / cu_seq_lens_k int32 [n + 1] on ``device``, max_length_q /
    max_length_k python ints)."""
    import torch

    if pack:
        ids, labels, pos, bounds = [], [], [], [0]
        for e in batch:
            ids += e.ids
            labels += [IGNORE_INDEX] + e.labels[1:]
            pos += list(range(len(e)))
            bounds.append(bounds[-1] + len(e))
        cu = torch.tensor(bounds, dtype=torch.int32, device=device)
        longest = max(len(e) for e in batch)
        return {"input_ids": torch.tensor([ids], device=device), "labels": torch.tensor([labels], device=device),
                "position_ids": torch.tensor([pos], device=device),
                # transformers' FlashAttention kwargs, from the lengths on the host (no device sync): a varlen
                # attention (hearth's, FlashAttention's) takes them; SDPA / eager ignore them and read the
                # packing from the position ids
                "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest,
                "use_cache": False}  # transformers reads packing from position ids only without a KV cache
    width = max(len(e) for e in batch)
    ids = [e.ids + [pad_id] * (width - len(e)) for e in batch]
    labels = [e.labels + [IGNORE_INDEX] * (width - len(e)) for e in batch]
    mask = [[1] * len(e) + [0] * (width - len(e)) for e in batch]
    out = {"input_ids": torch.tensor(ids, device=device), "labels": torch.tensor(labels, device=device)}
    if any(len(e) < width for e in batch):
        out["attention_mask"] = torch.tensor(mask, device=device)
    return out
