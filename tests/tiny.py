"""Tiny models for tests: a BPE tokenizer from stdlib source, a random Llama target saved in
Hugging Face format, random and quickly-fitted EAGLE-3 drafters. All built in seconds on CPU."""
from __future__ import annotations

import glob
import os
import sysconfig
from pathlib import Path

import torch

from models.eagle3 import Eagle3Config, Eagle3Drafter
from models.eagle3_checkpoint import save_drafter
from models.tokenizer import build_tokenizer


def stdlib_texts(n_files: int = 40) -> list[str]:
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:n_files]
    return [Path(f).read_text(errors="replace") for f in files]


def make_hf_llama_target(path: Path):
    """A tiny random HF Llama target (4 layers, hidden 32) with a 300-token BPE tokenizer trained on
    stdlib source, written by transformers itself; returns the tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = build_tokenizer(stdlib_texts(4), 300, path)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                 eos_token_id=tok.eos_token_id, initializer_range=0.05)).save_pretrained(path)
    return tok


def make_target_dir(path: Path, vocab_size: int = 512, layers: int = 4, hidden: int = 64, seed: int = 0,
                    max_positions: int = 512, init_std: float = 0.02) -> Path:
    """Tokenizer + random-weight HF LlamaForCausalLM in `path`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(stdlib_texts(), vocab_size, path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False, initializer_range=init_std)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def random_drafter(target, draft_vocab: int | None = None, seed: int = 1) -> Eagle3Drafter:
    tc = target.config
    dv = draft_vocab or tc.vocab_size
    torch.manual_seed(seed)
    cfg = Eagle3Config(hidden_size=tc.hidden_size, intermediate_size=2 * tc.hidden_size,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=tc.hidden_size // 4,
                       vocab_size=tc.vocab_size, draft_vocab_size=dv, target_hidden_size=tc.hidden_size,
                       aux_layer_ids=list(target.aux_layer_ids), max_position_embeddings=tc.max_position_embeddings)
    d = Eagle3Drafter(cfg)
    d.embed_tokens.weight.data.copy_(target.embed_tokens.weight.data)
    used = torch.arange(dv) * (tc.vocab_size // dv)  # spread over the vocabulary
    d.d2t.copy_(used - torch.arange(dv))
    d.t2d.zero_()
    d.t2d[used] = True
    return d.eval()


def fit_drafter(target, drafter: Eagle3Drafter, sequences: list[list[int]], steps: int = 200,
                lr: float = 3e-3) -> Eagle3Drafter:
    """Teacher-forced fit: pair (h_i, x_{i+1}) predicts x_{i+2}, plus one unrolled step on the
    drafter's own hidden state, so the test drafter agrees with the target most of the time."""
    drafter.train()
    t2d_index = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    used = torch.arange(drafter.config.draft_vocab_size) + drafter.d2t
    t2d_index[used] = torch.arange(drafter.config.draft_vocab_size)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    for step in range(steps):
        seq = torch.tensor([sequences[step % len(sequences)]])
        with torch.no_grad():
            aux = target(seq, capture_aux=True).aux_hidden
        hid, loss = aux[:, :-2], 0.0
        for k in range(2):  # step 0 on target states, step 1 on the drafter's own states
            n = seq.shape[1] - 2 - k
            out = drafter(seq[:, 1 + k:1 + k + n], hid[:, :n])
            labels = t2d_index[seq[:, 2 + k:2 + k + n]]
            loss = loss + torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-1)
            hid = out.hidden[:, :-1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    opt.zero_grad()   # no gradients left on it: the engine sees a drafter as loaded from disk
    return drafter.eval()


def export_drafter(drafter: Eagle3Drafter, path: Path) -> Path:
    save_drafter(drafter, path, dtype=torch.float32)
    return path
