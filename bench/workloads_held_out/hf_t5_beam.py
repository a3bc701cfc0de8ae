"""Summarisation-style generation with Hugging Face transformers' own T5ForConditionalGeneration (random
initialisation: 3+3 layers, d256, 4 heads, FFN 1024, vocab 8000): 6 requests, inputs of 32..256 tokens, beam search
with 4 beams for up to 40 new tokens (generate())."""
import torch
from transformers import T5Config, T5ForConditionalGeneration

torch.manual_seed(23)
torch.set_num_threads(1)
model = T5ForConditionalGeneration(T5Config(num_layers=3, num_decoder_layers=3, d_model=256, num_heads=4, d_kv=64,
                                            d_ff=1024, vocab_size=8000, decoder_start_token_id=0, pad_token_id=0,
                                            eos_token_id=1)).eval()
with torch.no_grad():
    for _ in range(6):
        n = int(torch.randint(32, 257, ()))
        ids = torch.randint(2, 8000, (1, n))
        model.generate(input_ids=ids, num_beams=4, max_new_tokens=40, min_new_tokens=40, do_sample=False)
