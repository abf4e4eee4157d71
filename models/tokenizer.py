"""Tokenizers: the one for a model path (a Hugging Face directory or a GGUF checkpoint), and
building a byte-level BPE one with a ChatML chat template, saved in Hugging Face format.

The built one serves the shipped small model and tests: nothing can be downloaded here, so the
project makes its own tokenizer from text it has.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from models.gguf import gguf_file
from models.gguf_header import read_gguf_header

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def load_tokenizer(path: str | Path):
    """The tokenizer of a model path. For a GGUF: the tokenizer files beside it when there are
    (tokenizer.json and tokenizer_config.json), else the one transformers rebuilds from the GGUF;
    either way the GGUF's chat template and EOS fill in what the tokenizer lacks."""
    from transformers import AutoTokenizer
    file = gguf_file(path)
    if file is None:
        return AutoTokenizer.from_pretrained(str(path))
    folder = file.parent
    beside = (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    tok = AutoTokenizer.from_pretrained(str(folder), **({} if beside else {"gguf_file": file.name}))
    meta = read_gguf_header(file).metadata
    if tok.chat_template is None and "tokenizer.chat_template" in meta:
        tok.chat_template = meta["tokenizer.chat_template"]
    if tok.eos_token_id is None and "tokenizer.ggml.eos_token_id" in meta:
        tok.eos_token = tok.convert_ids_to_tokens(meta["tokenizer.ggml.eos_token_id"])
    return tok


def build_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path):
    """Train BPE on `texts` and save tokenizer files into out_dir; returns the HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token=None,
                                 pad_token="<|endoftext|>", unk_token=None)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(out_dir))
    return hf
