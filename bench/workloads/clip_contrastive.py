"""Contrastive image-text training (CLIP-style): a patch-embedding vision tower (patch 16 on 128x128, d256, 3
layers) and a text tower (vocab 8000, 3 layers, d256, captions of 8..48 tokens), a symmetric InfoNCE loss over the
batch's similarity matrix; 5 AdamW steps with batch drawn from 8..24."""
import torch
from torch import nn

torch.manual_seed(14)
torch.set_num_threads(1)


def tower():
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True,
                                                            norm_first=True), 3, enable_nested_tensor=False)


patch, vis, txt_emb, txt = nn.Conv2d(3, 256, 16, 16), tower(), nn.Embedding(8000, 256), tower()
vpos, tpos = nn.Parameter(torch.zeros(1, 64, 256)), nn.Parameter(torch.zeros(1, 48, 256))
vproj, tproj = nn.Linear(256, 128, bias=False), nn.Linear(256, 128, bias=False)
params = [p for m in (patch, vis, txt_emb, txt, vproj, tproj) for p in m.parameters()] + [vpos, tpos]
opt = torch.optim.AdamW(params, 1e-4)
for _ in range(5):
    b = int(torch.randint(8, 25, ()))
    t = int(torch.randint(8, 49, ()))
    img = vis(patch(torch.randn(b, 3, 128, 128)).flatten(2).transpose(1, 2) + vpos).mean(1)
    cap = txt(txt_emb(torch.randint(0, 8000, (b, t))) + tpos[:, :t])[:, -1]
    a = nn.functional.normalize(vproj(img), dim=-1)
    c = nn.functional.normalize(tproj(cap), dim=-1)
    sim = a @ c.t() / 0.07
    target = torch.arange(b)
    loss = (nn.functional.cross_entropy(sim, target) + nn.functional.cross_entropy(sim.t(), target)) / 2
    opt.zero_grad()
    loss.backward()
    opt.step()
