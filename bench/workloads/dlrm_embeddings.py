"""Recommendation training with embeddings: a DLRM-style model (8 EmbeddingBag tables of 2000..10000 rows x 64,
sum pooling, bag lengths drawn from 1..40 per sample, a bottom MLP 13-256-64 over dense features, pairwise dot
interactions, a top MLP 512-256-1), batch drawn from 128..1024, 12 steps of SGD with sparse embedding gradients."""
import torch
from torch import nn

torch.manual_seed(5)
torch.set_num_threads(1)
rows = [2000, 4000, 6000, 8000, 10000, 3000, 5000, 7000]
tables = nn.ModuleList([nn.EmbeddingBag(r, 64, mode="sum", sparse=True) for r in rows])
bottom = nn.Sequential(nn.Linear(13, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU())
top = nn.Sequential(nn.Linear(64 + 36, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))
sparse_opt = torch.optim.SGD(tables.parameters(), lr=0.01)
dense_opt = torch.optim.SGD(list(bottom.parameters()) + list(top.parameters()), lr=0.01)
for _ in range(12):
    b = int(torch.randint(128, 1025, ()))
    dense = torch.randn(b, 13)
    feats = [bottom(dense)]
    for t, r in zip(tables, rows):
        lengths = torch.randint(1, 41, (b,))
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        feats.append(t(torch.randint(0, r, (int(lengths.sum()),)), offsets))
    z = torch.stack(feats, 1)
    inter = torch.bmm(z, z.transpose(1, 2))
    iu = torch.triu_indices(9, 9, 1)
    x = torch.cat([feats[0], inter[:, iu[0], iu[1]]], 1)
    loss = nn.functional.binary_cross_entropy_with_logits(top(x).squeeze(1), torch.rand(b).round())
    sparse_opt.zero_grad()
    dense_opt.zero_grad()
    loss.backward()
    sparse_opt.step()
    dense_opt.step()
