"""Point-cloud classification with variable point counts: PointNet (shared MLP 3-64-128-1024 as 1x1 convs, a 3x3
input transform net, max pooling, classifier 512-256-40), batch 4, 8 SGD steps with 128..1024 points per cloud."""
import torch
from torch import nn

torch.manual_seed(13)
torch.set_num_threads(1)


def shared(*ch):
    layers = []
    for a, b in zip(ch, ch[1:]):
        layers += [nn.Conv1d(a, b, 1), nn.BatchNorm1d(b), nn.ReLU()]
    return nn.Sequential(*layers)


tnet_feat, tnet_fc = shared(3, 64, 128, 256), nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 9))
feat = shared(3, 64, 128, 1024)
cls = nn.Sequential(nn.Linear(1024, 512), nn.ReLU(), nn.Dropout(0.3), nn.Linear(512, 256), nn.ReLU(),
                    nn.Linear(256, 40))
mods = nn.ModuleList([tnet_feat, tnet_fc, feat, cls])
opt = torch.optim.SGD(mods.parameters(), 0.01, momentum=0.9)
for _ in range(8):
    n = int(torch.randint(128, 1025, ()))
    pts, y = torch.randn(4, 3, n), torch.randint(0, 40, (4,))
    t = tnet_fc(tnet_feat(pts).amax(2)).view(4, 3, 3) + torch.eye(3)
    logits = cls(feat(torch.bmm(t, pts)).amax(2))
    loss = nn.functional.cross_entropy(logits, y) + 1e-3 * (torch.bmm(t, t.transpose(1, 2)) - torch.eye(3)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
