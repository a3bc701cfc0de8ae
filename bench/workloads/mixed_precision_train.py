"""Mixed-precision training on CPU: a small ConvNeXt-style network (depthwise 7x7 convs, LayerNorm, inverted
bottleneck MLPs; 3 stages of 48-192 channels) trained under torch.autocast("cpu", dtype=torch.bfloat16) with fp32
master weights and AdamW, 5 steps of 16x3x96x96 with random flips and crops to 80..96."""
import torch
from torch import nn

torch.manual_seed(11)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw, self.norm = nn.Conv2d(c, c, 7, padding=3, groups=c), nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        return x + self.mlp(self.norm(y)).permute(0, 3, 1, 2)


net = nn.Sequential(nn.Conv2d(3, 48, 4, 4), Block(48), Block(48), nn.Conv2d(48, 96, 2, 2), Block(96), Block(96),
                    nn.Conv2d(96, 192, 2, 2), Block(192), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(192, 10))
opt = torch.optim.AdamW(net.parameters(), 1e-3)
for _ in range(5):
    side = 16 * int(torch.randint(5, 7, ()))
    x = torch.randn(16, 3, 96, 96)
    x = torch.where(torch.rand(16, 1, 1, 1) < 0.5, x.flip(-1), x)[:, :, :side, :side]
    y = torch.randint(0, 10, (16,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
