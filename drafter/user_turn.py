"""Where a user's message goes in the target's chat template, found Magpie's way (Xu et al.
2024): render a conversation whose user message is a placeholder and cut the text there. The
part before it ends with the user-turn header; an aligned model continued from there writes
what a user would ask. Nothing about the template's format (ChatML, Llama-3, ...) is assumed.
"""
from __future__ import annotations

from dataclasses import dataclass

PLACEHOLDER = "<<user message placeholder>>"


@dataclass(frozen=True)
class UserTurn:
    prefix: str        # the rendered text up to and including the user-turn header
    end_of_turn: str   # what the template writes right after the user's message


def user_turn(tok, system: str) -> UserTurn:
    """The template around a user message that follows `system` ("" for no system message,
    which leaves the template's own default in place)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": PLACEHOLDER}]
    text = tok.apply_chat_template(messages, tokenize=False)
    at = text.find(PLACEHOLDER)
    if at < 0:
        raise ValueError("the chat template does not write the user's message verbatim: no user turn to cut at")
    return UserTurn(text[:at], text[at + len(PLACEHOLDER):])


def special_tokens(tok) -> dict[int, str]:
    """Every special token, including the template's markers that are not in the tokenizer's
    special-tokens map (ChatML's <|im_start|> often is not)."""
    return {i: t.content for i, t in tok.added_tokens_decoder.items() if t.special}


def end_of_turn_ids(tok, turn: UserTurn) -> list[int]:
    """The ids that end a written user message: the template's end-of-turn token (the first
    token after the message, when it is special) and the tokenizer's EOS."""
    after = tok(turn.end_of_turn, add_special_tokens=False)["input_ids"]
    ids = {after[0]} if after and after[0] in special_tokens(tok) else set()
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    return sorted(ids)


def template_markers(tok, turn: UserTurn) -> list[str]:
    """Strings that only the template writes: in a written message they mean the model left
    the user turn (or copied the placeholder)."""
    return sorted({PLACEHOLDER, turn.end_of_turn.strip(), *special_tokens(tok).values()} - {""})
