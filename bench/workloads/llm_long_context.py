"""Long-context generation: the decoder of decoder_common.py, one sequence, a 2048-token prompt prefilled in chunks
of 256 into a preallocated cache of 2304 positions (written in place, attention over the filled prefix), then 160
greedy tokens."""
import torch
from decoder_common import Decoder, LAYERS, KV_HEADS, HD, VOCAB

torch.manual_seed(9)
torch.set_num_threads(1)
model = Decoder().eval()
MAX, PROMPT, CHUNK, NEW = 2304, 2048, 256, 160
ck = torch.zeros(LAYERS, 1, KV_HEADS, MAX, HD)
cv = torch.zeros_like(ck)


def run(tokens, start):
    t = tokens.shape[1]
    n = start + t
    pos = torch.arange(start, n)[None]
    x = model.emb(tokens)
    mask = torch.ones(t, n, dtype=torch.bool).tril(start) if t > 1 else None
    for li, layer in enumerate(model.layers):
        q, k, v = layer.qkv(x, pos)
        ck[li, :, :, start:n] = k
        cv[li, :, :, start:n] = v
        x = layer.finish(x, q, ck[li, :, :, :n], cv[li, :, :, :n], mask)
    return model.logits(x)


with torch.no_grad():
    prompt = torch.randint(0, VOCAB, (1, PROMPT))
    for s in range(0, PROMPT, CHUNK):
        logits = run(prompt[:, s:s + CHUNK], s)
    nxt = logits.argmax(-1, keepdim=True)
    for i in range(NEW):
        nxt = run(nxt, PROMPT + i).argmax(-1, keepdim=True)
