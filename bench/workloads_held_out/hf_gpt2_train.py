"""GPT-2 language-model training with Hugging Face transformers' own GPT2LMHeadModel (random initialisation: 4 layers,
d256, 4 heads, vocab 8000): 6 AdamW steps, batch 4, sequence length drawn from 64..256 per step."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(21)
torch.set_num_threads(1)
model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8000, n_positions=512))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(6):
    n = int(torch.randint(64, 257, ()))
    ids = torch.randint(0, 8000, (4, n))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
