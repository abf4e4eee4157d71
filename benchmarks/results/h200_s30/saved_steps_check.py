"""Do saved compiled steps load under the GPU image's torch (2.11)? One decoder compiles the 3-step chain
at batch 1 (random tiny models, bf16, CUDA graphs) and saves it; a second loads it. Prints each one's
counts (BatchDecoder.saved_compiles) and seconds, and whether both decode the same tokens.

    python3 benchmarks/results/h200_s30/saved_steps_check.py
"""
import logging
import tempfile
import time

import torch

from engine.decoder import BatchDecoder, SpecConfig
from engine.sampling import BatchSampling
from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.llama import LlamaConfig, LlamaModel

logging.basicConfig(level=logging.INFO)
print("torch", torch.__version__, flush=True)
torch.manual_seed(0)
with torch.device("cuda"):
    t = LlamaModel(LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32), [0, 1, 2])
    d = Eagle3Drafter(Eagle3Config(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=32, vocab_size=512, draft_vocab_size=512,
                                   target_hidden_size=128, aux_layer_ids=[0, 1, 2]))
d.embed_tokens.weight = t.embed_tokens.weight
d.t2d.fill_(True)
t, d = t.to(torch.bfloat16).eval(), d.to(torch.bfloat16).eval()
folder = tempfile.mkdtemp()
outs = []
with torch.inference_mode():
    for run in ("saves", "loads"):
        start = time.perf_counter()
        dec = BatchDecoder(t, d, SpecConfig(3), 4, 512, fast_greedy=True, compile=True, compile_cache=folder)
        out = [[tok] for tok in dec.prefill_batch(0, [[5, 6, 7]], BatchSampling.all_greedy_rows(1, "cuda"))]
        while len(out[0]) < 32:
            out[0] += dec.step(1, BatchSampling.all_greedy_rows(1, "cuda"))[0].tokens
        outs.append(out[0][:32])
        print(run, dec.saved_compiles(), f"{time.perf_counter() - start:.1f} s", flush=True)
print("same tokens:", outs[0] == outs[1])
