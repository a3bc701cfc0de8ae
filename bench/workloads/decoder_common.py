"""A small Llama-style decoder shared by the generation workloads (RMSNorm, rotary positions, grouped-query
attention, SwiGLU); the KV cache is managed by each workload."""
import torch
from torch import nn
import torch.nn.functional as F

D, HEADS, KV_HEADS, LAYERS, VOCAB, FF = 256, 8, 2, 4, 8000, 688
HD = D // HEADS


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(D))

    def forward(self, x):
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rope(x, pos):
    """x: (batch, heads, tokens, HD); pos: (batch, tokens) positions."""
    inv = 1.0 / (10000 ** (torch.arange(0, HD, 2) / HD))
    ang = pos[:, None, :, None].float() * inv
    c, s = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RMSNorm(), RMSNorm()
        self.q, self.kv, self.o = nn.Linear(D, D, bias=False), nn.Linear(D, 2 * KV_HEADS * HD, bias=False), \
            nn.Linear(D, D, bias=False)
        self.gate_up, self.down = nn.Linear(D, 2 * FF, bias=False), nn.Linear(FF, D, bias=False)

    def qkv(self, x, pos):
        b, t, _ = x.shape
        h = self.n1(x)
        q = rope(self.q(h).view(b, t, HEADS, HD).transpose(1, 2), pos)
        k, v = self.kv(h).view(b, t, 2, KV_HEADS, HD).permute(2, 0, 3, 1, 4)
        return q, rope(k, pos), v

    def finish(self, x, q, k, v, mask):
        k = k.repeat_interleave(HEADS // KV_HEADS, 1)
        v = v.repeat_interleave(HEADS // KV_HEADS, 1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).flatten(2))
        g, u = self.gate_up(self.n2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.layers = nn.Embedding(VOCAB, D), nn.ModuleList([Layer() for _ in range(LAYERS)])
        self.norm, self.head = RMSNorm(), nn.Linear(D, VOCAB, bias=False)

    def logits(self, x):
        return self.head(self.norm(x[:, -1]))
