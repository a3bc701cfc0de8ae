"""Batched generation with a growing KV cache and early finishing: the decoder of decoder_common.py, 3 rounds of a
batch of 6 prompts (left-padded to the longest, 16..160 tokens), up to 96 new tokens with a stop probability per
token, the KV cache grown by concatenation each step and the batch shrunk (cache rows dropped by index) as sequences
finish; top-p sampling."""
import torch
from decoder_common import Decoder, VOCAB

torch.manual_seed(8)
torch.set_num_threads(1)
model = Decoder().eval()


def step(x, pos, cache, mask):
    new = []
    for li, layer in enumerate(model.layers):
        q, k, v = layer.qkv(x, pos)
        if cache is not None:
            k, v = torch.cat([cache[li][0], k], 2), torch.cat([cache[li][1], v], 2)
        new.append((k, v))
        x = layer.finish(x, q, k, v, mask)
    return model.logits(x), new


def sample(logits, p=0.9):
    probs, idx = logits.softmax(-1).sort(-1, descending=True)
    keep = probs.cumsum(-1) - probs < p
    probs = probs * keep
    return idx.gather(-1, torch.multinomial(probs / probs.sum(-1, keepdim=True), 1))


with torch.no_grad():
    for _ in range(3):
        lens = torch.randint(16, 161, (6,))
        t = int(lens.max())
        valid = torch.arange(t)[None] >= (t - lens)[:, None]                   # left padding
        tokens = torch.randint(0, VOCAB, (6, t))
        pos = (valid.cumsum(1) - 1).clamp(min=0)
        mask = (torch.ones(t, t, dtype=torch.bool).tril()[None] & valid[:, None, :])[:, None]
        logits, cache = step(model.emb(tokens), pos, None, mask)
        nxt, last_pos, alive = sample(logits), pos[:, -1:], valid
        for _ in range(96):
            last_pos = last_pos + 1
            alive = torch.cat([alive, torch.ones(len(alive), 1, dtype=torch.bool)], 1)
            logits, cache = step(model.emb(nxt), last_pos, cache, alive[:, None, None, :])
            nxt = sample(logits)
            going = torch.rand(len(nxt)) > 0.03
            if not going.all():
                if not going.any():
                    break
                keep = going.nonzero().squeeze(1)
                cache = [(k.index_select(0, keep), v.index_select(0, keep)) for k, v in cache]
                nxt, last_pos, alive = nxt[keep], last_pos[keep], alive[keep]
