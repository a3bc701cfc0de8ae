"""Convolutional VAE training: encoder 3x64x64 -> 4 strided convs (32-256 channels) -> latent 128, decoder with
transposed convs, reconstruction + KL loss, 6 Adam steps of batch 32."""
import torch
from torch import nn

torch.manual_seed(12)
torch.set_num_threads(1)
enc = nn.Sequential(nn.Conv2d(3, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 4, 2, 1), nn.ReLU(),
                    nn.Conv2d(64, 128, 4, 2, 1), nn.ReLU(), nn.Conv2d(128, 256, 4, 2, 1), nn.ReLU(), nn.Flatten(),
                    nn.Linear(256 * 16, 256))
dec = nn.Sequential(nn.Linear(128, 256 * 16), nn.Unflatten(1, (256, 4, 4)), nn.ConvTranspose2d(256, 128, 4, 2, 1),
                    nn.ReLU(), nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(64, 32, 4, 2, 1),
                    nn.ReLU(), nn.ConvTranspose2d(32, 3, 4, 2, 1), nn.Sigmoid())
opt = torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()), 1e-3)
for _ in range(6):
    x = torch.rand(32, 3, 64, 64)
    mu, logvar = enc(x).chunk(2, 1)
    z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
    rec = dec(z)
    loss = nn.functional.binary_cross_entropy(rec, x, reduction="sum") / 32 \
        - 0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum() / 32
    opt.zero_grad()
    loss.backward()
    opt.step()
