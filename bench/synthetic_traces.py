"""Synthetic allocation logs of workloads that are not in /work/shared/traces/, for checking that an allocator policy
chosen on those six traces generalises. Each generator plays a framework's tensor lifetimes (eager mode, as
PyTorch's caching allocator sees them: every op output is a new allocation, freed when its last user is done) and
returns the events; ``write`` saves them in RMM's CSV log format, so that ``python -m paddle_rt replay LOG --baselines``
replays them and gives their Paddle auto-growth and PyTorch anchors.

    python bench/synthetic_traces.py OUTDIR        # writes OUTDIR/<name>.csv.gz for every workload

The workloads (deterministic: fixed seeds):

``gpt_train_adamw``    a GPT-style decoder (6 layers, d 512, 8 heads, vocab 16000, fp32), batch 8 x sequence 256,
                       4 steps of AdamW (foreach update: per-step temporaries for every parameter at once), grads set
                       to None between steps (PyTorch's default), activations kept for backward.
``kv_generation``      autoregressive generation with a growing KV cache (12 layers, d 1024, 16 heads, vocab 32000,
                       fp16, batch 4): per request a prompt of 64..192 tokens (prefill) then 160 decode steps, each
                       appending one token to every layer's K and V by concatenation (a new cache of length t+1, the
                       old one freed); 3 requests one after the other.
``cnn_varres_infer``   a CNN (ResNet-like, 4 stages) serving requests of varying batch (1..16) and resolution
                       (160..320 px, multiples of 32), 12 requests, fp32.

and variants of each with other sizes (``WORKLOADS``: wider and smaller GPTs, a long-sequence one with a large
vocabulary, generation at batch 16 and at batch 1 with a larger model, the CNN at batch up to 32).
"""
import gzip
import os
import random
import sys

__all__ = ["WORKLOADS", "generate", "write", "as_trace"]


class Log:
    """Records allocate/free events of tensors (ids), checks every free matches a live tensor."""

    def __init__(self):
        self.events = []          # (is_alloc, size, id)
        self.live = {}
        self.next_id = 1

    def alloc(self, nbytes):
        i = self.next_id
        self.next_id += 1
        n = int(nbytes)
        self.live[i] = n
        self.events.append((1, n, i))
        return i

    def free(self, *ids):
        for i in ids:
            if i is None:
                continue
            del self.live[i]
            self.events.append((0, 0, i))


def gpt_train_adamw(log, layers=6, d=512, heads=8, vocab=16000, batch=8, seq=256, steps=4):
    f = 4
    B, S, H = batch, seq, heads
    # parameters (created in module order), then the optimizer's states on the first step
    params = []

    def p(n):
        params.append((log.alloc(n * f), n * f))
    p(vocab * d)                    # token embedding (tied with the output head)
    p(seq * d)                      # positions
    for _ in range(layers):
        for n in (d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d):
            p(n)
    p(d)
    p(d)
    states = []
    grads = {}
    for step in range(steps):
        idx = log.alloc(B * S * 8)                                   # int64 token ids
        tgt = log.alloc(B * S * 8)
        x = log.alloc(B * S * d * f)                                 # embedding + positions
        saved = []
        for _ in range(layers):
            ln1 = log.alloc(B * S * d * f)
            st1 = (log.alloc(B * S * f), log.alloc(B * S * f))      # mean, rstd
            qkv = log.alloc(B * S * 3 * d * f)
            q, k, v = (log.alloc(B * S * d * f) for _ in range(3))    # head-split contiguous copies
            log.free(qkv)
            sc = log.alloc(B * H * S * S * f)                        # scores
            mask = log.alloc(B * H * S * S)                          # causal mask applied (bool)
            pr = log.alloc(B * H * S * S * f)                        # softmax
            log.free(sc, mask)
            ctx = log.alloc(B * S * d * f)
            ctx2 = log.alloc(B * S * d * f)                          # merge heads (contiguous)
            log.free(ctx)
            o = log.alloc(B * S * d * f)
            r1 = log.alloc(B * S * d * f)                            # residual
            ln2 = log.alloc(B * S * d * f)
            st2 = (log.alloc(B * S * f), log.alloc(B * S * f))
            h1 = log.alloc(B * S * 4 * d * f)
            g = log.alloc(B * S * 4 * d * f)                         # gelu
            h2 = log.alloc(B * S * d * f)
            r2 = log.alloc(B * S * d * f)
            log.free(o, h2)
            saved.append([ln1, *st1, q, k, v, pr, ctx2, r1, ln2, *st2, h1, g])
            x_prev, x = x, r2
            saved[-1].append(x_prev)
        lnf = log.alloc(B * S * d * f)
        logits = log.alloc(B * S * vocab * f)
        lsm = log.alloc(B * S * vocab * f)                           # log_softmax for the loss
        loss = log.alloc(4)
        log.free(loss)
        # backward
        dl = log.alloc(B * S * vocab * f)
        log.free(lsm, logits)

        def grad_of(pi):
            if pi not in grads:
                grads[pi] = log.alloc(params[pi][1])
            else:
                tmp = log.alloc(params[pi][1])                       # accumulate into an existing grad
                log.free(tmp)
        grad_of(0)                                                   # tied head
        dx = log.alloc(B * S * d * f)
        log.free(dl, lnf)
        for li in reversed(range(layers)):
            base = 2 + 12 * li
            s = saved[li]
            d2 = log.alloc(B * S * d * f)                            # through fc2
            grad_of(base + 10)
            grad_of(base + 11)
            dg = log.alloc(B * S * 4 * d * f)
            dh = log.alloc(B * S * 4 * d * f)
            log.free(d2, dg)
            grad_of(base + 8)
            grad_of(base + 9)
            dln2 = log.alloc(B * S * d * f)
            log.free(dh)
            grad_of(base + 6)
            grad_of(base + 7)
            dr1 = log.alloc(B * S * d * f)
            log.free(dln2)
            do = log.alloc(B * S * d * f)
            grad_of(base + 4)
            grad_of(base + 5)
            dctx = log.alloc(B * S * d * f)
            dp = log.alloc(B * H * S * S * f)
            dsc = log.alloc(B * H * S * S * f)
            log.free(dp)
            dq, dk, dv = (log.alloc(B * S * d * f) for _ in range(3))
            log.free(dsc, dctx)
            dqkv = log.alloc(B * S * 3 * d * f)
            log.free(dq, dk, dv)
            grad_of(base + 2)
            grad_of(base + 3)
            dln1 = log.alloc(B * S * d * f)
            log.free(dqkv, do)
            grad_of(base + 0)
            grad_of(base + 1)
            dxn = log.alloc(B * S * d * f)
            log.free(dln1, dr1, dx)
            dx = dxn
            log.free(*s)
        grad_of(1)
        grad_of(len(params) - 2)                                     # final layer norm
        grad_of(len(params) - 1)
        log.free(dx, x, idx, tgt)
        # AdamW, foreach: states on the first step; temporaries for every parameter at once
        if not states:
            for _, n in params:
                states.append((log.alloc(n), log.alloc(n)))
        tmp = [log.alloc(n) for _, n in params]                      # bias-corrected second moment, sqrt
        tmp2 = [log.alloc(n) for _, n in params]                     # + eps, the update
        log.free(*tmp)
        log.free(*tmp2)
        # zero_grad(set_to_none=True)
        log.free(*grads.values())
        grads.clear()


def kv_generation(log, layers=12, d=1024, heads=16, vocab=32000, batch=4, requests=3, new_tokens=160, seed=1):
    f = 2
    rng = random.Random(seed)
    B = batch
    for n in [vocab * d] + [n for _ in range(layers) for n in (d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d,
                                                                4 * d, 4 * d * d, d)] + [d, d]:
        log.alloc(n * f)                                             # weights, kept
    for _ in range(requests):
        prompt = rng.randrange(64, 193)
        cache = []

        def block(T, cache_len, prefill):
            x = log.alloc(B * T * d * f)
            for li in range(layers):
                ln = log.alloc(B * T * d * f)
                qkv = log.alloc(B * T * 3 * d * f)
                q = log.alloc(B * T * d * f)
                k = log.alloc(B * T * d * f)
                v = log.alloc(B * T * d * f)
                log.free(ln, qkv)
                if prefill:
                    cache.append([k, v])
                    L = T
                else:
                    K = log.alloc(B * (cache_len + T) * d * f)         # torch.cat((past_k, k))
                    V = log.alloc(B * (cache_len + T) * d * f)
                    log.free(cache[li][0], cache[li][1], k, v)
                    cache[li] = [K, V]
                    L = cache_len + T
                sc = log.alloc(B * heads * T * L * f)
                pr = log.alloc(B * heads * T * L * f)
                log.free(sc)
                ctx = log.alloc(B * T * d * f)
                log.free(pr, q)
                o = log.alloc(B * T * d * f)
                log.free(ctx)
                r = log.alloc(B * T * d * f)
                log.free(o)
                ln2 = log.alloc(B * T * d * f)
                h = log.alloc(B * T * 4 * d * f)
                g = log.alloc(B * T * 4 * d * f)
                log.free(h, ln2)
                m = log.alloc(B * T * d * f)
                log.free(g)
                y = log.alloc(B * T * d * f)
                log.free(m, r, x)
                x = y
            lnf = log.alloc(B * d * f)                                # the last position only
            logits = log.alloc(B * vocab * 4)                        # fp32 logits
            log.free(x, lnf)
            probs = log.alloc(B * vocab * 4)
            tok = log.alloc(B * 8)
            log.free(logits, probs, tok)

        block(prompt, 0, True)
        for t in range(new_tokens):
            block(1, prompt + t, False)
        for K, V in cache:
            log.free(K, V)


def cnn_varres_infer(log, requests=12, seed=2, max_batch=16):
    f = 4
    rng = random.Random(seed)
    widths = (64, 128, 256, 512)
    for cin, cout in ((3, 64),) + tuple((w, w) for w in widths) + tuple(zip(widths[:-1], widths[1:])):
        for _ in range(2):
            log.alloc(cin * cout * 9 * f)                            # conv weights
            log.alloc(cout * f)
    log.alloc(512 * 1000 * f)
    for _ in range(requests):
        b = rng.randrange(1, max_batch + 1)
        hw = rng.choice(range(160, 321, 32))
        inp = log.alloc(b * 3 * hw * hw * f)
        x = log.alloc(b * 64 * (hw // 2) ** 2 * f)                  # stem conv, stride 2
        log.free(inp)
        s = hw // 4
        y = log.alloc(b * 64 * s * s * f)                            # max pool
        log.free(x)
        x = y
        for si, w in enumerate(widths):
            if si:
                s //= 2
            for blk in range(2):
                a = log.alloc(b * w * s * s * f)
                a2 = log.alloc(b * w * s * s * f)                    # relu
                log.free(a)
                c = log.alloc(b * w * s * s * f)
                log.free(a2)
                sc = log.alloc(b * w * s * s * f) if (si and not blk) else None   # projection shortcut
                out = log.alloc(b * w * s * s * f)
                log.free(c, sc, x)
                x = out
        pooled = log.alloc(b * 512 * f)
        log.free(x)
        logits = log.alloc(b * 1000 * f)
        log.free(pooled)
        top = log.alloc(b * 5 * 8)
        log.free(logits, top)


#: name -> (generator, keyword arguments). The first three are the base workloads; the others vary their sizes
#: (model width and depth, batch, sequence, generation length, seeds) so that a policy is checked on a family of
#: workloads, not on three points.
WORKLOADS = {
    "gpt_train_adamw": (gpt_train_adamw, {}),
    "kv_generation": (kv_generation, {}),
    "cnn_varres_infer": (cnn_varres_infer, {}),
    "gpt_train_small": (gpt_train_adamw, dict(layers=4, d=384, heads=6, vocab=8000, batch=16, seq=128, steps=3)),
    "gpt_train_wide": (gpt_train_adamw, dict(layers=8, d=768, heads=12, vocab=32000, batch=4, seq=512, steps=3)),
    "gpt_train_long": (gpt_train_adamw, dict(layers=4, d=256, heads=4, vocab=50000, batch=2, seq=1024, steps=3)),
    "kv_gen_batch16": (kv_generation, dict(layers=8, d=512, heads=8, vocab=32000, batch=16, requests=2,
                                           new_tokens=256, seed=3)),
    "kv_gen_batch1": (kv_generation, dict(layers=16, d=1536, heads=12, vocab=50000, batch=1, requests=2,
                                          new_tokens=300, seed=4)),
    "cnn_varres_b32": (cnn_varres_infer, dict(requests=16, seed=5, max_batch=32)),
}


def generate(name):
    """The events of workload ``name``: a list of (is_alloc, size, id)."""
    log = Log()
    fn, kw = WORKLOADS[name]
    fn(log, **kw)
    return log.events


def write(events, path):
    """Save events as an RMM allocation log (gzip'd CSV), ending with memory still live like the real traces."""
    with gzip.open(path, "wt", newline="") as fh:
        fh.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for k, (is_alloc, size, i) in enumerate(events):
            fh.write(f"0,{k * 1e-6:.6f},{'allocate' if is_alloc else 'free'},0x{i:x},{size},0\n")


def as_trace(events):
    """The replay tool's in-memory form (paddle_rt.tools.replay.load_trace) of ``events``, without a file."""
    from paddle_rt.tools.replay import TraceBuilder
    trace = TraceBuilder()
    for is_alloc, size, i in events:
        if is_alloc:
            trace.allocate(i, size)
        else:
            trace.free(i)
    return trace.result()


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    for name in WORKLOADS:
        path = os.path.join(out, f"{name}.csv.gz")
        ev = generate(name)
        write(ev, path)
        print(f"{path}: {sum(e[0] for e in ev)} allocations")
