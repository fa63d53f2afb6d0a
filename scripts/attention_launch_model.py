"""A greedy model of one fused-backward launch: how much of its time is tail, by grid order.

    python scripts/attention_launch_model.py --lens 1024,3072,1024,3072,1024,3072,1024,3072 --kv-heads 4 --group 5
    python scripts/attention_launch_model.py --lens 2048x8 --groups 1,4,8,16,all --longest-first

What it models: the causal packed (or dense) fused backward's programs, one per (sequence, K/V head, 128-key block),
each costing a fixed `--overhead` plus its steps (GROUP query heads x the 64-query blocks at or past its key block's
diagonal; a key block past the sequence's keys costs a twentieth of a step), dispatched in grid order to the first
free of `--sms` slots (one program an SM: the kernel's shared memory allows no second). Grid order: groups of n
(sequence, K/V head) pairs, key blocks interleaved within a group (attention_gluon.fb_pair_group: n = all pairs is
the every-pair order, 1 FlashAttention-3's pair-major one); --longest-first takes the sequences longest first
(the HEARTH_ATTN_FB_SEQ_ORDER probe switch). Efficiency = (the programs' summed cost / SMs) / the makespan.

What it does not model, and why its figures guide rather than predict: L2. Programs that run at once read the Q and
dO of as many pairs as they span; the every-pair order scores well here and measured 13-29% slower on an H100 at
T 1024-4096 for that reason (BENCHMARKS.md, forty-second run). Nor the dispatch order of a real GPU, which is only
roughly the block-id order, nor the steps' unequal cost (the diagonal step's mask). Twice its tail figures did
not show on an H100 (BENCHMARKS.md, forty-third run): longest first (16% -> 8% of tail here) measured +0.6% and
-1.7%, and one launch of 8 K/V heads against two of 4 (0.84 -> 0.96 on the 1:3 packing, 0.97 both on a uniform
one) gained 6.6% and 6.9% alike.
"""

from __future__ import annotations

import argparse
import heapq


def programs(lens: list[int], kv_heads: int, group: int, pairs_per_group: int, *, block_m: int = 64,
             block_n: int = 128, longest_first: bool = False) -> list[int]:
    """Steps of each program in dispatch order (0: a key block past its sequence's keys)."""
    if not lens or min(lens) < 1:
        raise ValueError(f"lens must be positive lengths, got {lens}")
    if kv_heads < 1 or group < 1 or pairs_per_group < 1:
        raise ValueError("kv_heads, group and pairs_per_group must be >= 1")
    order = sorted(lens, reverse=True) if longest_first else list(lens)
    pairs = [n for n in order for _ in range(kv_heads)]  # sequence-major, as backward_fused_varlen's grid
    n_kb = -(-max(lens) // block_n)
    out = []
    for g0 in range(0, len(pairs), pairs_per_group):
        for kb in range(n_kb):
            for n in pairs[g0:g0 + pairs_per_group]:
                start = kb * block_n
                out.append(group * (-(-n // block_m) - start // block_m) if start < n else 0)
    return out


def efficiency(steps: list[int], sms: int = 132, overhead: float = 4.0) -> float:
    """(summed cost / sms) / makespan of greedy dispatch in list order."""
    if sms < 1:
        raise ValueError(f"sms must be >= 1, got {sms}")
    free = [0.0] * sms
    end = total = 0.0
    for s in steps:
        cost = overhead + s if s > 0 else overhead / 20
        total += cost
        t = heapq.heappop(free) + cost
        end = max(end, t)
        heapq.heappush(free, t)
    return total / sms / end


def _lens(text: str) -> list[int]:
    """"1024,3072" or "2048x8" (8 sequences of 2048), comma-separated items."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        n, _, times = item.partition("x")
        out += [int(n)] * (int(times) if times else 1)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lens", required=True, help='sequence lengths: "1024,3072,..." or "2048x8"')
    ap.add_argument("--kv-heads", type=int, default=4, help="K/V heads in one launch (fused_chunk's), default 4")
    ap.add_argument("--group", type=int, default=5, help="query heads a K/V head (GQA), default 5")
    ap.add_argument("--groups", default="1,2,4,8,16,all", help="pairs a group, comma-separated ('all': every pair)")
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=4.0, help="a program's fixed cost, in steps (default 4)")
    ap.add_argument("--longest-first", action="store_true", help="also the sequences longest first")
    args = ap.parse_args(argv)
    lens = _lens(args.lens)
    n_pairs = len(lens) * args.kv_heads
    print(f"{len(lens)} sequences ({min(lens)}-{max(lens)} tokens) x {args.kv_heads} K/V heads = {n_pairs} pairs, "
          f"GROUP {args.group}, {args.sms} SMs")
    orders = {"packed order": False, "longest first": True} if args.longest_first else {"packed order": False}
    for g in (x.strip() for x in args.groups.split(",")):
        n = n_pairs if g == "all" else int(g)
        effs = (efficiency(programs(lens, args.kv_heads, args.group, n, block_m=args.block_m, longest_first=first),
                           args.sms, args.overhead) for first in orders.values())
        print(f"pairs a group {g:>4}: " + ", ".join(f"{name} {e:.2f}" for name, e in zip(orders, effs)))


if __name__ == "__main__":
    main()
