"""Batched generation with a paged KV cache: the decoder of decoder_common.py (d256, 4 layers, 8 query / 2 KV heads),
a pool of 16-token KV blocks per layer (preallocated), a block table per sequence; 4 requests arriving at different
steps (prompts 20..120 tokens), each generating 40..120 tokens; each step gathers every sequence's blocks into a
contiguous K/V (sizes grow with the context), greedy decoding."""
import torch
from decoder_common import Decoder, LAYERS, KV_HEADS, HD, VOCAB

torch.manual_seed(7)
torch.set_num_threads(1)
BLOCK, NBLOCKS = 16, 128
model = Decoder().eval()
pool_k = torch.zeros(LAYERS, NBLOCKS, KV_HEADS, BLOCK, HD)
pool_v = torch.zeros_like(pool_k)
free_blocks = list(range(NBLOCKS))
reqs = [{"arrive": a, "prompt": int(torch.randint(20, 121, ())), "gen": int(torch.randint(40, 121, ()))}
        for a in (0, 10, 25, 50)]
live = []


def run_seq(seq, tokens, start):
    """Run `tokens` (1, t) of `seq` at positions start.., writing K/V into its blocks; the last token's logits."""
    t = tokens.shape[1]
    while len(seq["blocks"]) * BLOCK < start + t:
        seq["blocks"].append(free_blocks.pop())
    pos = torch.arange(start, start + t)[None]
    x = model.emb(tokens)
    table = torch.tensor(seq["blocks"])
    for li, layer in enumerate(model.layers):
        q, k, v = layer.qkv(x, pos)
        for j in range(t):
            p = start + j
            pool_k[li, seq["blocks"][p // BLOCK], :, p % BLOCK] = k[0, :, j]
            pool_v[li, seq["blocks"][p // BLOCK], :, p % BLOCK] = v[0, :, j]
        n = start + t
        kk = pool_k[li, table].permute(1, 0, 2, 3).reshape(KV_HEADS, -1, HD)[None, :, :n]
        vv = pool_v[li, table].permute(1, 0, 2, 3).reshape(KV_HEADS, -1, HD)[None, :, :n]
        mask = torch.ones(t, n, dtype=torch.bool).tril(n - t) if t > 1 else None
        x = layer.finish(x, q, kk, vv, mask)
    return model.logits(x)


with torch.no_grad():
    step = 0
    while reqs or live:
        while reqs and reqs[0]["arrive"] <= step:
            r = reqs.pop(0)
            seq = {"blocks": [], "len": r["prompt"], "left": r["gen"]}
            seq["next"] = run_seq(seq, torch.randint(0, VOCAB, (1, r["prompt"])), 0).argmax(-1)
            live.append(seq)
        for seq in list(live):
            seq["next"] = run_seq(seq, seq["next"][None], seq["len"]).argmax(-1)
            seq["len"] += 1
            seq["left"] -= 1
            if seq["left"] == 0:
                free_blocks.extend(seq["blocks"])
                live.remove(seq)
        step += 1
