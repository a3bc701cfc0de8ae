"""CNN inference at varying resolution: a ResNet-style classifier (4 stages, 32-256 channels, BatchNorm in eval
mode), batch 4, 12 requests with the image side drawn from 96..288 (multiples of 32)."""
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), block(32, 32, 1), block(32, 64, 2), block(64, 128, 2),
                      block(128, 256, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100)).eval()
with torch.no_grad():
    for _ in range(12):
        side = 32 * int(torch.randint(3, 10, ()))
        logits = model(torch.randn(4, 3, side, side))
        top = logits.softmax(-1).topk(5)
