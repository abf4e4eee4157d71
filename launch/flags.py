"""The command-line flags of profile settings, generated from the tables that declare them.

Every field of [native] (engine/config.py: NativeConfig) and [server] gets a flag named by
`profiles.flag_name` (native.max_batch -> --max-batch), typed by the field and helped by its
description; its value overrides the profile's (`Overrides.settings`). The speculative
settings' flags (--steps, --topk, --draft-tokens) come from SpecConfig's fields the same way
but keep their own override rules (launch/profiles.py: a chain's draft tokens follow --steps).
"""
from __future__ import annotations

import argparse

from engine.config import NativeConfig, SpecConfig
from launch.profiles import ServerSection, flag_name, scalar_type, table_fields

GENERATED = {"server": ServerSection, "native": NativeConfig}
SPECULATIVE = ("steps", "topk", "draft_tokens")  # Overrides' own fields, same names
KEEP = "a flag not given keeps the profile's value (with --no-profile, the default shown)"


def _default(info) -> str:
    d = info.get_default(call_default_factory=True)
    if isinstance(d, bool):
        d = "on" if d else "off"
    return "" if d is None or d == "" else f" (default {d})"


def _steps(v: str):
    if v == "auto":
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {v!r}") from None


def add_setting_flags(ap: argparse.ArgumentParser) -> None:
    """Add the generated flags; each stores under its dotted key (None: not given)."""
    spec = table_fields(SpecConfig)
    group = ap.add_argument_group("speculative settings", f"override [speculative]; {KEEP}")
    for name in SPECULATIVE:
        info = spec[name]
        help_ = info.description + _default(info)
        if name == "steps":
            group.add_argument("--steps", dest="steps", type=_steps,
                               help=help_ + "; 'auto': the best of the profile's step sweep")
        else:
            group.add_argument(flag_name(name), dest=name, type=int, metavar=name.upper(), help=help_)
    for section, cls in GENERATED.items():
        group = ap.add_argument_group(f"{section} settings", f"override [{section}]; {KEEP}")
        for name, info in table_fields(cls).items():
            key, hint = f"{section}.{name}", scalar_type(info.annotation)
            kind = ({"action": argparse.BooleanOptionalAction} if hint is bool
                    else {"type": hint or str, "metavar": name.upper()})
            group.add_argument(flag_name(key), dest=key, default=None, help=(info.description or "") + _default(info),
                               **kind)


def settings(args: argparse.Namespace) -> dict:
    """The generated flags that were given: {"native.max_batch": 4, ...}."""
    return {k: v for k, v in vars(args).items() if "." in k and v is not None}
