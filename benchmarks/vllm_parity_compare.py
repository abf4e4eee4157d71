"""Compare two side results of benchmarks/vllm_parity.py (vLLM and native), prompt by prompt.

A side result is a dict: `engine`, `version`, `load_s`, `generate_s` and `outputs`, one per
prompt in prompt order: `token_ids`, `text`, `finish_reason`, `verify_steps`,
`proposed_draft_tokens`, `accepted_draft_tokens`; the vLLM side adds `counters`, its
aggregate spec-decode metrics. Greedy decoding is lossless in both engines, so equal targets
must give equal texts; a difference names its first differing token and character.

Two accept lengths per engine, because the two conventions differ by the first token:
  accept_length = completion tokens / verify steps (DESIGN §2; counts the prefill's token),
  mean_acceptance_length = 1 + accepted draft tokens / verify steps (vLLM's formula).
"""
from __future__ import annotations

from benchmarks.report import md_table


def first_difference(a: list, b: list) -> int | None:
    """The first index where two sequences differ (the shorter one's length if one is a prefix
    of the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def side_summary(side: dict) -> dict:
    outs = side["outputs"]
    tokens = sum(len(o["token_ids"]) for o in outs)
    verify = sum(o["verify_steps"] for o in outs)
    accepted = sum(o["accepted_draft_tokens"] for o in outs)
    summary = {"engine": side["engine"], "version": side["version"], "completion_tokens": tokens,
               "verify_steps": verify, "accept_length": _ratio(tokens, verify),
               "mean_acceptance_length": 1 + accepted / verify if verify else None,
               "accept_rate": _ratio(accepted, sum(o["proposed_draft_tokens"] for o in outs)),
               "load_s": side["load_s"], "generate_s": side["generate_s"],
               "tok_per_s": _ratio(tokens, side["generate_s"])}
    if "counters" in side:  # vLLM's own metrics, over the same requests
        c = side["counters"]
        drafts = c["vllm:spec_decode_num_drafts"]
        summary["metrics_mean_acceptance_length"] = 1 + c["vllm:spec_decode_num_accepted_tokens"] / drafts \
            if drafts else None
    return summary


def _prompt_row(i: int, v: dict, n: dict) -> dict:
    return {"prompt": i, "equal_text": v["text"] == n["text"], "equal_tokens": v["token_ids"] == n["token_ids"],
            "first_diff_token": first_difference(v["token_ids"], n["token_ids"]),
            "first_diff_char": first_difference(v["text"], n["text"]),
            "vllm_tokens": len(v["token_ids"]), "native_tokens": len(n["token_ids"]),
            "vllm_accept_length": _ratio(len(v["token_ids"]), v["verify_steps"]),
            "native_accept_length": _ratio(len(n["token_ids"]), n["verify_steps"])}


def compare(vllm: dict, native: dict) -> dict:
    if len(vllm["outputs"]) != len(native["outputs"]):
        raise ValueError(f"{len(vllm['outputs'])} vLLM outputs against {len(native['outputs'])} native ones")
    rows = [_prompt_row(i, v, n) for i, (v, n) in enumerate(zip(vllm["outputs"], native["outputs"]))]
    return {"prompts": len(rows),
            "equal_text_fraction": sum(r["equal_text"] for r in rows) / len(rows) if rows else None,
            "equal_tokens_fraction": sum(r["equal_tokens"] for r in rows) / len(rows) if rows else None,
            "engines": [side_summary(vllm), side_summary(native)], "per_prompt": rows}


def _excerpt(text: str, at: int, width: int = 40) -> str:
    return repr(text[max(0, at - width // 2):at + width])


def markdown(report: dict, vllm: dict, native: dict, command: str) -> str:
    """The summary page: command, engines side by side, per-prompt table, each difference."""
    c = report
    lines = ["# vLLM vs native: greedy EAGLE-3 parity", "", "```", command, "```", "",
             f"Equal texts: {sum(r['equal_text'] for r in c['per_prompt'])}/{c['prompts']} "
             f"({c['equal_text_fraction']:.0%}); equal token ids: {c['equal_tokens_fraction']:.0%}.", ""]
    keys = ["engine", "version", "completion_tokens", "verify_steps", "accept_length", "mean_acceptance_length",
            "metrics_mean_acceptance_length", "accept_rate", "load_s", "generate_s", "tok_per_s"]
    lines.append(md_table(keys, [[e.get(k) for k in keys] for e in c["engines"]]))
    lines += ["accept_length = completion tokens / verify steps (bonus included); mean_acceptance_length = "
              "1 + accepted / verify steps (vLLM's formula); metrics_mean_acceptance_length: the same from "
              "vLLM's `get_metrics()` counters. Wall times in seconds, batch 1, after one warm-up request.", ""]
    cols = list(c["per_prompt"][0]) if c["per_prompt"] else []
    lines.append(md_table(cols, [[r[k] for k in cols] for r in c["per_prompt"]]))
    for r in c["per_prompt"]:
        if not r["equal_text"]:
            i, at = r["prompt"], r["first_diff_char"]
            lines += [f"Prompt {i}, from character {at} (token {r['first_diff_token']}):", "",
                      f"- vLLM:   {_excerpt(vllm['outputs'][i]['text'], at)}",
                      f"- native: {_excerpt(native['outputs'][i]['text'], at)}", ""]
    return "\n".join(lines)
