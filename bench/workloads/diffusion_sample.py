"""Diffusion sampling: a small U-Net denoiser (3 levels, 64-256 channels, GroupNorm, sinusoidal time embedding,
attention at the lowest level) run for 25 DDIM steps on a batch of 2 64x64x3 latents, with classifier-free guidance
(conditional and unconditional halves batched together)."""
import math
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(4)
torch.set_num_threads(1)


class Res(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(128, cout)
        self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Conv2d(3, 64, 3, padding=1)
        self.d1, self.d2, self.d3 = Res(64, 64), Res(64, 128), Res(128, 256)
        self.attn = nn.MultiheadAttention(256, 4, batch_first=True)
        self.u3, self.u2, self.u1 = Res(256 + 256, 128), Res(128 + 128, 64), Res(64 + 64, 64)
        self.out = nn.Conv2d(64, 3, 3, padding=1)
        self.cond = nn.Embedding(11, 128)

    def forward(self, x, t, c):
        half = torch.exp(-math.log(10000) * torch.arange(64) / 64)
        temb = torch.cat([torch.sin(t[:, None] * half), torch.cos(t[:, None] * half)], 1) + self.cond(c)
        h1 = self.d1(self.inp(x), temb)
        h2 = self.d2(F.avg_pool2d(h1, 2), temb)
        h3 = self.d3(F.avg_pool2d(h2, 2), temb)
        b, ch, hh, ww = h3.shape
        s = h3.flatten(2).transpose(1, 2)
        h3 = h3 + self.attn(s, s, s, need_weights=False)[0].transpose(1, 2).reshape(b, ch, hh, ww)
        u = self.u3(torch.cat([h3, h3], 1), temb)
        u = self.u2(torch.cat([F.interpolate(u, scale_factor=2.0), h2], 1), temb)
        u = self.u1(torch.cat([F.interpolate(u, scale_factor=2.0), h1], 1), temb)
        return self.out(u)


net = UNet().eval()
alphas = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000), 0)
steps = torch.linspace(999, 0, 25).long()
with torch.no_grad():
    x = torch.randn(2, 3, 64, 64)
    cond = torch.tensor([3, 7, 10, 10])
    for i, t in enumerate(steps):
        eps_c, eps_u = net(torch.cat([x, x]), t.float().repeat(4), cond).chunk(2)
        eps = eps_u + 5.0 * (eps_c - eps_u)
        a = alphas[t]
        a_prev = alphas[steps[i + 1]] if i + 1 < len(steps) else torch.tensor(1.0)
        x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
        x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
