"""Detection-style inference with variable box counts: a small conv backbone (stride 16, 128 channels) on 256x256
images, a dense head scoring 4 anchors per cell, score threshold and top-k (the number of kept boxes varies 20..400
per image), ROI features pooled per box by gather, a per-box MLP classifier and box regressor; 10 images."""
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(1)
torch.set_num_threads(1)
backbone = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
                         nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU(), nn.Conv2d(128, 128, 3, 2, 1), nn.ReLU()).eval()
head = nn.Conv2d(128, 4 * 5, 1).eval()
roi_mlp = nn.Sequential(nn.Linear(128 * 9, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU()).eval()
cls, reg = nn.Linear(512, 81).eval(), nn.Linear(512, 4).eval()
with torch.no_grad():
    for _ in range(10):
        feat = backbone(torch.randn(1, 3, 256, 256))             # 1x128x16x16
        out = head(feat).view(4, 5, 16, 16).permute(0, 2, 3, 1).reshape(-1, 5)
        scores = out[:, 0].sigmoid()
        k = int(torch.randint(20, 401, ()))
        keep = scores.topk(min(k, scores.numel() - 1)).indices
        boxes = out[keep, 1:].sigmoid() * 15
        cx, cy = boxes[:, 0].long(), boxes[:, 1].long()
        padded = F.pad(feat[0], (1, 1, 1, 1))
        rois = torch.stack([padded[:, cy + dy, cx + dx] for dy in range(3) for dx in range(3)], 0)
        h = roi_mlp(rois.permute(2, 1, 0).reshape(len(keep), -1))
        labels, deltas = cls(h).softmax(-1).argmax(-1), reg(h)
        final = torch.cat([boxes + deltas, labels[:, None].float()], 1)
