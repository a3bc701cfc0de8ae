#!/usr/bin/env python
"""Make a random checkpoint for generate.py, saved by transformers' ``save_pretrained`` (nothing is downloaded):

    python examples/llama/make_checkpoint.py stories15M [--family llama|llama3|qwen2|qwen3|mistral]
        [--size 15M|100M] [--seed 0]

15M is llama2.c's stories15M shape (6 layers, d288, 6 heads, vocab 32000, tied embeddings), 100M a d768, 12-layer,
12 query / 4 KV head model; the families are those of paddle_rt.bench.llm.FAMILIES (llama3: Llama 3.1's rope
scaling; mistral: a 32-position sliding window). Needs torch and transformers (pip install torch==2.13.0 --index-url
https://download.pytorch.org/whl/cpu, PyTorch's CPU wheel index, then pip install "paddle_rt[examples]"). A bad
argument is one line and exit status 2.
"""
import argparse
import os
import sys

PROG = "make_checkpoint.py"


def main(argv=None):
    from paddle_rt.bench import llm
    p = argparse.ArgumentParser(prog=PROG, description="Make a random checkpoint folder for generate.py.")
    p.add_argument("folder", help="the checkpoint folder to write (must not exist yet)")
    p.add_argument("--family", default="llama", choices=sorted(llm.FAMILIES))
    p.add_argument("--size", default="15M", choices=sorted(llm.CONFIGS))
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if os.path.exists(a.folder):
        print(f"{PROG}: error: {a.folder}: exists already (give a new folder name)", file=sys.stderr)
        return 2
    parent = os.path.dirname(os.path.abspath(a.folder))
    if not os.path.isdir(parent):
        print(f"{PROG}: error: {a.folder}: no such folder {os.path.dirname(a.folder)}", file=sys.stderr)
        return 2
    try:
        import torch
        import transformers
    except ImportError as exc:
        print(f"{PROG}: error: needs torch and transformers: pip install torch==2.13.0 "
              f"--index-url https://download.pytorch.org/whl/cpu (PyTorch's CPU wheel index), "
              f"then pip install 'paddle_rt[examples]' ({exc})", file=sys.stderr)
        return 2
    llm.build_checkpoint(transformers, torch, a.folder, llm.CONFIGS[a.size], seed=a.seed, family=a.family)
    print(f"{a.folder}: a random {a.family} checkpoint of the {a.size} shape (seed {a.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
