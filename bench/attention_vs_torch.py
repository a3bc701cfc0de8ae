"""Attention against torch at one thread count, the two bench ops rows only (decode over 1024 cached positions,
prefill of 256 queries; 32 query / 8 kv heads, d128): ours and torch alternating, 15 rounds, medians.

    PADDLE_RT_NUM_THREADS=1 python bench/attention_vs_torch.py 1
"""
import sys
import time

import numpy as np
import torch

import paddle_rt
from paddle_rt.bench._torch_ops import _attention_case


def main(threads):
    torch.set_num_threads(threads)
    paddle_rt.op.set_num_threads(threads)
    rng = np.random.default_rng(0)
    for name, (seq, pos, cache), calls in (("decode", (1, 1023, 1024), 20), ("prefill", (256, 0, 1024), 4)):
        ours, theirs = _attention_case(torch, rng, seq, pos, cache)     # also checks that both agree
        times = {ours: [], theirs: []}
        for _ in range(15):
            for fn in (ours, theirs):
                t = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[fn].append((time.perf_counter() - t) / calls)
        mo, mt = (np.median(times[f]) * 1e3 for f in (ours, theirs))
        print(f"{name} threads={threads}: paddle_rt {mo:.3f} ms  torch {mt:.3f} ms  ratio {mt / mo:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
