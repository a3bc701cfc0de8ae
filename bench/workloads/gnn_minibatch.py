"""GNN mini-batch training: a 3-layer GraphSAGE (mean aggregation by index_add, hidden 256) on sampled subgraphs of a
random graph (features 128, 40 classes); each of 10 Adam steps samples a subgraph of 300..2000 nodes with 8..15
neighbours per node, so node and edge counts vary."""
import torch
from torch import nn

torch.manual_seed(3)
torch.set_num_threads(1)


class Sage(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.self_lin, self.neigh_lin = nn.Linear(cin, cout), nn.Linear(cin, cout, bias=False)

    def forward(self, x, src, dst):
        agg = torch.zeros_like(x).index_add_(0, dst, x[src])
        deg = torch.zeros(x.shape[0]).index_add_(0, dst, torch.ones(len(dst))).clamp_(min=1)
        return self.self_lin(x) + self.neigh_lin(agg / deg[:, None])


layers = nn.ModuleList([Sage(128, 256), Sage(256, 256), Sage(256, 40)])
opt = torch.optim.Adam(layers.parameters(), 1e-3)
for _ in range(10):
    n = int(torch.randint(300, 2001, ()))
    fanout = int(torch.randint(8, 16, ()))
    dst = torch.arange(n).repeat_interleave(fanout)
    src = torch.randint(0, n, (n * fanout,))
    x, y = torch.randn(n, 128), torch.randint(0, 40, (n,))
    for i, layer in enumerate(layers):
        x = layer(x, src, dst)
        if i < len(layers) - 1:
            x = torch.relu(x)
    loss = nn.functional.cross_entropy(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
