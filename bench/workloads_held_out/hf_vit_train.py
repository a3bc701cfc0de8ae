"""Image classification training with Hugging Face transformers' own ViTForImageClassification (random
initialisation: 4 layers, d192, 3 heads, patch 16, 10 labels): 6 AdamW steps, batch drawn from 4..24 of 3x128x128
images."""
import torch
from transformers import ViTConfig, ViTForImageClassification

torch.manual_seed(24)
torch.set_num_threads(1)
model = ViTForImageClassification(ViTConfig(num_hidden_layers=4, hidden_size=192, num_attention_heads=3,
                                            intermediate_size=768, image_size=128, patch_size=16, num_labels=10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(6):
    b = int(torch.randint(4, 25, ()))
    out = model(pixel_values=torch.randn(b, 3, 128, 128), labels=torch.randint(0, 10, (b,)))
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
