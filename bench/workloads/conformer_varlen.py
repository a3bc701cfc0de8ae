"""Speech/conformer inference with variable lengths: conv subsampling (x4) of 80-dim filterbanks, 4 conformer blocks
(d 144, 4 heads, FFN x4 macaron, depthwise conv kernel 15), CTC log-softmax over 256 tokens; 12 utterances of
100..1200 frames, batch 2."""
import torch
from torch import nn

torch.manual_seed(2)
torch.set_num_threads(1)
D = 144


class ConvModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.pw1 = nn.LayerNorm(D), nn.Conv1d(D, 2 * D, 1)
        self.dw, self.bn, self.pw2 = nn.Conv1d(D, D, 15, padding=7, groups=D), nn.BatchNorm1d(D), nn.Conv1d(D, D, 1)

    def forward(self, x):
        y = self.pw1(self.norm(x).transpose(1, 2))
        y = nn.functional.glu(y, dim=1)
        return self.pw2(nn.functional.silu(self.bn(self.dw(y)))).transpose(1, 2)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        ff = lambda: nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.SiLU(), nn.Linear(4 * D, D))  # noqa
        self.ff1, self.ff2, self.conv, self.norm = ff(), ff(), ConvModule(), nn.LayerNorm(D)
        self.attn_norm, self.attn = nn.LayerNorm(D), nn.MultiheadAttention(D, 4, batch_first=True)

    def forward(self, x):
        x = x + 0.5 * self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.conv(x)
        return self.norm(x + 0.5 * self.ff2(x))


sub = nn.Sequential(nn.Conv2d(1, D, 3, 2), nn.ReLU(), nn.Conv2d(D, D, 3, 2), nn.ReLU())
proj, blocks, out = nn.Linear(D * 19, D), nn.Sequential(*[Block() for _ in range(4)]), nn.Linear(D, 256)
for m in (sub, proj, blocks, out):
    m.eval()
with torch.no_grad():
    for _ in range(12):
        frames = int(torch.randint(100, 1201, ()))
        x = sub(torch.randn(2, 1, frames, 80))
        x = proj(x.permute(0, 2, 1, 3).flatten(2))
        logp = out(blocks(x)).log_softmax(-1)
        best = logp.argmax(-1)
