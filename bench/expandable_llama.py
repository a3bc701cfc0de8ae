"""The Llama example's peak reserved against peak live with expandable segments on and off (issue 34 item 7).

examples/llama loads a random checkpoint (made by transformers' ``save_pretrained``) and generates after a prompt,
from an idle cache: ``paddle_rt.bench.llm._memory_run``, the figure ``bench --only llm`` reports. rt_cpu:0 runs with
``expandable_segments:1``, rt_cpu:1 with ``:0``; each checkpoint is run once per mode, the modes alternating. "Live"
is the peak of the device's stream-ordered pool's used bytes (weights, KV cache and activations).

    python bench/expandable_llama.py [--sizes tiny,small,15M,100M] [--tokens 48]
"""
import argparse
import os
import sys
import tempfile

import _checkout  # noqa: F401  (a checkout's in-place build when paddle_rt is not installed)
import numpy as np

import paddle_rt
from paddle_rt.bench import llm

MiB = 1 << 20
# Two checkpoints smaller than the bench's: one with tied embeddings and grouped-query attention, one untied.
SMALL = {
    "tiny": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=True),
    "small": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=8000, tie_word_embeddings=False),
}
MODES = (("rt_cpu:0", "expandable_segments:1"), ("rt_cpu:1", "expandable_segments:0"))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="tiny,small,15M,100M")
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args(argv)
    torch, transformers, llama_checkpoint, llama_model = llm._imports()
    configs = dict(SMALL, **llm.CONFIGS)
    devices = []
    for name, conf in MODES:
        d = paddle_rt.device(name)
        a = paddle_rt.get_allocator(d)
        llm._idle(d)
        a.configure(**dict(kv.split(":") for kv in conf.split(",")))
        devices.append(d)
    print("| checkpoint | live MiB | on: reserved MiB (/ live) | off: reserved MiB (/ live) | "
          "on <= live + 1 page per range |")
    print("|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="paddle_rt_expandable_llama_") as tmp:
        for size in args.sizes.split(","):
            folder = llm.build_checkpoint(transformers, torch, os.path.join(tmp, size), configs[size])
            config = llama_checkpoint.read_config(folder)
            prompt = [int(t) for t in np.random.default_rng(1).integers(0, config.vocab_size, llm.PROMPT_LEN)]
            res = {}
            for d in devices:
                res[str(d)] = llm._memory_run(llama_checkpoint, llama_model, folder, prompt, args.tokens, d)
            (on_res, on_live), (off_res, off_live) = res[str(devices[0])], res[str(devices[1])]
            g = paddle_rt.get_allocator(devices[0]).config()["granularity"]
            ranges = paddle_rt.memory_stats(devices[0])["segment.all.peak"]     # ranges held during the run
            pages = (on_res - on_live) / g
            print(f"| {size} | {on_live / MiB:.1f} | {on_res / MiB:.1f} ({on_res / on_live:.3f}x) | "
                  f"{off_res / MiB:.1f} ({off_res / off_live:.3f}x) | "
                  f"{'yes' if on_res <= on_live + ranges * g else 'no'} ({pages:.2f} pages over live) |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
