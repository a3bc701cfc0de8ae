"""Time-series forecasting with a temporal convolutional network: 6 residual blocks of dilated causal conv1d (64
channels, kernel 3, dilations 1..32, weight norm), 32 input series, windows of 96..720 steps drawn per step, batch
16, 8 Adam steps, then inference over one long series of 4096 steps."""
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

torch.manual_seed(15)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, cin, c, d):
        super().__init__()
        self.pad = 2 * d
        self.c1, self.c2 = weight_norm(nn.Conv1d(cin, c, 3, dilation=d)), weight_norm(nn.Conv1d(c, c, 3, dilation=d))
        self.skip = nn.Conv1d(cin, c, 1) if cin != c else nn.Identity()

    def forward(self, x):
        h = torch.relu(self.c1(nn.functional.pad(x, (self.pad, 0))))
        h = torch.relu(self.c2(nn.functional.pad(h, (self.pad, 0))))
        return torch.relu(h + self.skip(x))


net = nn.Sequential(*[Block(32 if i == 0 else 64, 64, 2 ** i) for i in range(6)], nn.Conv1d(64, 32, 1))
opt = torch.optim.Adam(net.parameters(), 1e-3)
for _ in range(8):
    w = int(torch.randint(96, 721, ()))
    x = torch.randn(16, 32, w + 1).cumsum(-1)
    loss = nn.functional.mse_loss(net(x[..., :-1]), x[..., 1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    forecast = net(torch.randn(1, 32, 4096).cumsum(-1))
