"""Engine logprobs (engine.api.TokenLogprob, one per emitted token) in OpenAI's shapes.

  chat         choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
  completions  choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
A token's text is its own decoding (a token that ends inside a UTF-8 character shows U+FFFD,
its bytes are those of that text). -inf is sent as -9999.0, as vLLM does: JSON has no
infinity. The completion offsets count characters of the completion text from 0 (plus the
echoed prompt's length with echo), continued across streamed deltas.
"""
from __future__ import annotations

import functools

from engine.api import TokenLogprob

NEG_INF = -9999.0


class LogprobFormatter:
    def __init__(self, tokenizer, chat: bool, offset: int = 0):
        self.chat, self.offset = chat, offset
        self._text = functools.lru_cache(maxsize=65536)(lambda t: tokenizer.decode([t]))

    def format(self, ids: list[int], lps: list[TokenLogprob]) -> dict:
        return self._chat(ids, lps) if self.chat else self._completion(ids, lps)

    def _entry(self, tid: int, lp: float) -> dict:
        text = self._text(tid)
        return {"token": text, "logprob": max(lp, NEG_INF), "bytes": list(text.encode("utf-8"))}

    def _chat(self, ids, lps) -> dict:
        return {"content": [{**self._entry(t, lp.logprob), "top_logprobs": [self._entry(i, v) for i, v in lp.top]}
                            for t, lp in zip(ids, lps)]}

    def _completion(self, ids, lps) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, lp in zip(ids, lps):
            text = self._text(t)
            out["tokens"].append(text)
            out["token_logprobs"].append(max(lp.logprob, NEG_INF))
            # As OpenAI: the sampled token is always among them, so there may be k + 1.
            top = {self._text(i): max(v, NEG_INF) for i, v in lp.top}
            top.setdefault(text, max(lp.logprob, NEG_INF))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
