"""`drafter data`: prompts -> target-regenerated conversations -> tokenized shards.

Layout of the output directory:
  generated.jsonl          conversations with the target's answers (append-only, resumable)
  generated.failed.jsonl   requests that failed for good (retried on the next run)
  shards/shard-*.safetensors, index.json   tokenized training data (see drafter/shards.py)
"""
from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from drafter.generate import GenParams, make_backend, regenerate
from drafter.prompts import count_lines, read_prompt_files
from drafter.shards import write_shards

GENERATED = "generated.jsonl"


@dataclass
class DataConfig:
    prompts: str | list[str]          # one prompt file, or several read interleaved by size
    out: str
    endpoint: str | None = None       # OpenAI-compatible base URL, e.g. http://host:8000/v1
    model: str | None = None          # model name for the endpoint
    api_key: str | None = None
    target: str | None = None         # in-process generation through the native engine
    tokenizer: str | None = None      # default: the target directory
    keep_responses: bool = False      # skip regeneration: use the data set's own answers
    request_token_ids: bool = False   # ask the endpoint for exact ids (vLLM `return_token_ids`)
    gen: GenParams = None
    concurrency: int = 64
    retries: int = 5
    timeout_s: float = 600.0
    limit: int = 0
    time_limit_s: float = 0           # > 0: stop generating after this long, shard what is answered
    shard_size: int = 10000
    device: str = "auto"
    dtype: str = "auto"
    max_batch: int = 16
    max_context: int = 0              # 0: the model's (size the KV cache: max_batch rows of it)
    drop_system: float = 0.0          # share of conversations answered without their system messages

    def __post_init__(self):
        if isinstance(self.prompts, str):
            self.prompts = [self.prompts]


def system_dropped(conv_id: str, share: float) -> bool:
    """Whether this conversation goes out without its system messages: a hash of its id, so a
    resumed or repeated run drops the same ones."""
    return int(hashlib.sha1(conv_id.encode()).hexdigest()[:8], 16) < share * 2 ** 32


async def _generate(c: DataConfig, out: Path) -> dict:
    if not (c.endpoint or c.target):
        raise ValueError("give --endpoint URL --model NAME, or --target DIR, or --keep-responses")
    backend = make_backend(endpoint=c.endpoint, model=c.model, api_key=c.api_key, target=c.target,
                           concurrency=c.concurrency, device=c.device, dtype=c.dtype, max_batch=c.max_batch,
                           max_context=c.max_context, timeout_s=c.timeout_s, retries=c.retries,
                           request_token_ids=c.request_token_ids)
    await backend.start()
    try:
        total = sum(count_lines(p) for p in c.prompts)
        total = min(total, c.limit) if c.limit else total
        convs = (conv.without_system() if system_dropped(conv.id, c.drop_system) else conv
                 for conv in read_prompt_files(c.prompts, c.limit))
        return await regenerate(convs, backend, out, c.gen or GenParams(),
                                concurrency=c.concurrency, total=total, time_limit_s=c.time_limit_s)
    finally:
        await backend.close()


def _copy_responses(c: DataConfig, out: Path) -> dict:
    with open(out, "w", encoding="utf-8") as f:
        n = 0
        for conv in read_prompt_files(c.prompts, c.limit):
            f.write(json.dumps({"id": conv.id, "messages": conv.messages, "finish_reasons": []},
                               ensure_ascii=False) + "\n")
            n += 1
    return {"copied": n}


def run_data(c: DataConfig) -> dict:
    from models.tokenizer import load_tokenizer
    if not 0 <= c.drop_system <= 1:
        raise ValueError(f"--drop-system is a share in [0, 1], got {c.drop_system}")
    if c.drop_system and c.keep_responses:
        raise ValueError("--drop-system changes what the target is asked; --keep-responses keeps answers written "
                         "under the original system messages")
    out_dir = Path(c.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok_path = c.tokenizer or c.target
    if not tok_path:
        raise ValueError("--tokenizer DIR is needed with --endpoint (the target's tokenizer and chat template)")
    tok = load_tokenizer(tok_path)
    generated = out_dir / GENERATED
    stats = _copy_responses(c, generated) if c.keep_responses else asyncio.run(_generate(c, generated))
    infos = write_shards(generated, tok, out_dir, c.shard_size)
    stats.update(shards=len(infos), records=sum(i.records for i in infos), tokens=sum(i.tokens for i in infos),
                 loss_tokens=sum(i.loss_tokens for i in infos))
    return stats
