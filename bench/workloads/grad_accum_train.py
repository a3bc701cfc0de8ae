"""Training with gradient accumulation: a Transformer encoder classifier (4 layers, d256, 4 heads, FFN 1024, vocab
10000, mean pooling), 4 optimizer steps of AdamW, each accumulating 4 micro-batches of 4 sequences whose length is
drawn from 32..128, gradient clipping before each step."""
import torch
from torch import nn

torch.manual_seed(10)
torch.set_num_threads(1)
emb = nn.Embedding(10000, 256)
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True), 4,
                            enable_nested_tensor=False)
head = nn.Linear(256, 20)
params = list(emb.parameters()) + list(enc.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, 1e-4)
for _ in range(4):
    opt.zero_grad(set_to_none=True)
    for _ in range(4):
        t = int(torch.randint(32, 129, ()))
        x, y = torch.randint(0, 10000, (4, t)), torch.randint(0, 20, (4,))
        loss = nn.functional.cross_entropy(head(enc(emb(x)).mean(1)), y) / 4
        loss.backward()
    nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
