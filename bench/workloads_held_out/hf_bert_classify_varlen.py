"""Text classification inference with Hugging Face transformers' own BertForSequenceClassification (random
initialisation: 4 layers, d256, 4 heads, vocab 12000, 3 labels): 16 batches of 1..16 sentences, each batch padded to
its longest sentence (8..384 tokens) with an attention mask."""
import torch
from transformers import BertConfig, BertForSequenceClassification

torch.manual_seed(22)
torch.set_num_threads(1)
model = BertForSequenceClassification(BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                                 intermediate_size=1024, vocab_size=12000, num_labels=3)).eval()
with torch.no_grad():
    for _ in range(16):
        b = int(torch.randint(1, 17, ()))
        lens = torch.randint(8, 385, (b,))
        n = int(lens.max())
        ids = torch.randint(1, 12000, (b, n))
        mask = (torch.arange(n)[None, :] < lens[:, None]).long()
        model(input_ids=ids * mask, attention_mask=mask).logits.argmax(-1)
