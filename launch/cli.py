"""`specserve` / `launch/serve.sh` / `python -m server`: resolve a profile, print it, export its
environment, check the drafter against the target and the checkpoint files for completeness,
then serve (or, with --dry-run, stop after printing; the weights files are checked only when
serving). `--no-profile` (what `python -m server` runs) starts from the engine's defaults
instead of a profile file. The settings' flags are generated from the profile's tables
(launch/flags.py).

Exit codes: 0 served and drained (SIGTERM included) or dry run; 2 bad profile, override,
model pair or missing/corrupt checkpoint file; 1 the server failed.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import signal
import sys
from dataclasses import dataclass, field

from launch.auto_steps import auto_setting
from launch.flags import add_setting_flags, settings
from launch.pair_check import CheckpointError, PairMismatch, check_checkpoint_files, check_pair_configs
from launch.profiles import Launch, Overrides, ProfileError, available_profiles, resolve
from server.tools import ParserSetupError, check_parser_names

NCCL_LABELS = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL")
KIMI_SHAPES = "drafter/configs"   # config.json-only folders of Kimi-K2.5 and its drafters, for dry runs
VLLM_FOLLOWER = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "--headless"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specserve", description="Serve an LLM with EAGLE-3 speculative decoding from a launch profile.",
        epilog=f"built-in profiles: {', '.join(available_profiles())}")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--profile", help="profile name or path to a .toml file (default: cpu-default without a "
                                         "GPU, gpu-native with one; or $SPECSERVE_PROFILE)")
    which.add_argument("--no-profile", action="store_true",
                       help="no profile file: the native engine's defaults and these flags, speculating when "
                            "--draft is given (`python -m server`)")
    ap.add_argument("--model", help="target model: HF directory, GGUF or pypi:PACKAGE (overrides the profile)")
    ap.add_argument("--draft", help="EAGLE-3 drafter directory (overrides the profile)")
    ap.add_argument("--no-spec", action="store_true", help="serve the target alone")
    ap.add_argument("--api-key", help="require this bearer token on /v1/* (default: $SPECSERVE_API_KEY)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the resolved configuration, environment and engine arguments, then exit")
    add_setting_flags(ap)
    return ap


def default_profile(environ) -> tuple[str, str]:
    if environ.get("SPECSERVE_PROFILE"):
        return environ["SPECSERVE_PROFILE"], "profile from $SPECSERVE_PROFILE"
    import torch
    if torch.cuda.is_available():
        return "gpu-native", "no --profile: a GPU is visible, using gpu-native"
    return "cpu-default", "no --profile and no GPU: using cpu-default"


@dataclass
class Plan:
    """What will run: the engine's arguments, and for SGLang and vLLM the same as a command line."""
    kind: str                       # native | sglang | sglang-follower | vllm | vllm-follower
    native_args: object = None
    sglang_kwargs: dict = field(default_factory=dict)
    sglang_argv: list[str] = field(default_factory=list)
    vllm_kwargs: dict = field(default_factory=dict)
    vllm_argv: list[str] = field(default_factory=list)


def make_plan(launch: Launch, draft_for_vllm: str | None = None) -> Plan:
    """`draft_for_vllm`: the drafter copy vLLM serves (launch/vllm_drafter.py; made when serving)."""
    from launch.engine_args import native_engine_args, sglang_cli, sglang_server_args, vllm_cli, vllm_engine_args

    p = launch.profile
    if p.engine == "native":
        return Plan("native", native_args=native_engine_args(p))
    if p.engine == "vllm":
        kw = vllm_engine_args(p, draft_for_vllm)
        return Plan("vllm-follower" if p.parallel.node_rank > 0 else "vllm", vllm_kwargs=kw, vllm_argv=vllm_cli(kw))
    kw = sglang_server_args(p)
    kind = "sglang-follower" if p.parallel.node_rank > 0 else "sglang"
    return Plan(kind, sglang_kwargs=kw, sglang_argv=sglang_cli(kw))


def describe(launch: Launch) -> str:
    p = launch.profile
    s, par, srv = p.speculative, p.parallel, p.server
    spec = (f"EAGLE3 steps {s.steps}, topk {s.topk}, draft tokens {s.draft_tokens}" if p.spec_enabled
            else "off")
    if p.spec_enabled and s.steps_by_batch:
        spec += ", per batch size " + ", ".join(f"<= {b}: {k}" for b, k in s.steps_by_batch)
    elif p.spec_enabled and s.accept_rates:
        spec += f", per batch size from step costs measured at load (accept rates {list(s.accept_rates)})"
    lines = [f"specserve: profile {p.name} ({p.source})"]
    if p.description:
        lines.append(f"  {p.description}")
    lines += [
        f"  engine       {p.engine}",
        f"  model        {p.model.path}",
        f"  draft        {p.model.draft or '-'}",
        f"  speculative  {spec}",
        f"  parallel     tp {par.tp}, nnodes {par.nnodes}, node rank {par.node_rank}"
        + (f", dist init {par.dist_init_addr}" if par.nnodes > 1 else ""),
        f"  server       {srv.host}:{srv.port}, model name {srv.served_model_name or os.path.basename(p.model.path)}, "
        f"api key {'set' if launch.api_key else 'none'}",
    ]
    if p.engine == "native":
        n = p.native
        lines.append(f"  native       device {n.device}, dtype {n.dtype}, max batch {n.max_batch}"
                     + (", torch.compile" if n.compile else ""))
    elif p.engine == "vllm":
        v = p.vllm
        lines.append(f"  vllm         pp {p.parallel.pp}, dtype {v.dtype}, max model len "
                     f"{v.max_model_len or 'the model'}, max num seqs {v.max_num_seqs or 'vLLM default'}"
                     + (", eager" if v.enforce_eager else ""))
    else:
        lines.append(f"  sglang       max running requests {sglang_max_running(p)}")
    lines.append("environment:" if launch.env else "environment: (none from the profile)")
    lines += [f"  {k}={v}    ({launch.env_origin[k]})" for k, v in launch.env.items()]
    lines += [f"note: {n}" for n in launch.notes]
    return "\n".join(lines)


def sglang_max_running(p) -> str:
    """SGLang 0.5.23 turns an unset max_running_requests into 48 once speculation is on
    (arg_groups/speculative_hook.py, _handle_eagle_family): a concurrency cap users should see."""
    if p.sglang.max_running_requests is not None:
        return f"{p.sglang.max_running_requests} (sglang.max_running_requests)"
    if p.spec_enabled:
        return "48 (unset: SGLang's default with speculation; set sglang.max_running_requests to change)"
    return "unset (SGLang sizes it from KV-cache memory)"


def describe_plan(plan: Plan) -> str:
    if plan.kind == "native":
        return f"native engine arguments: {plan.native_args}"
    if plan.kind == "vllm-follower":
        return ("vLLM follower node (headless workers, no HTTP front-end); runs:\n"
                f"  {shlex.join(VLLM_FOLLOWER + plan.vllm_argv)}")
    if plan.kind == "vllm":
        return ("vllm arguments (in-process AsyncLLM, same as the command line):\n"
                f"  vllm serve {shlex.join(plan.vllm_argv)}")
    argv = shlex.join(plan.sglang_argv)
    if plan.kind == "sglang-follower":
        return ("SGLang follower node (no HTTP front-end); runs:\n"
                f"  {shlex.join([sys.executable, '-m', 'sglang.launch_server'])} {argv}")
    return f"sglang arguments (in-process sglang.Engine, same as the command line):\n  {argv}"


def launch_info(launch: Launch) -> dict[str, str]:
    """Labels for specserve_launch_info: the effective profile, parameters and NCCL settings."""
    p = launch.profile
    s = p.speculative
    info = {"profile": p.name, "engine": p.engine,
            "model": p.server.served_model_name or os.path.basename(p.model.path),
            "draft": os.path.basename(p.model.draft or "") if p.spec_enabled else "",
            "steps": str(s.steps if p.spec_enabled else 0), "topk": str(s.topk if p.spec_enabled else 0),
            "draft_tokens": str(s.draft_tokens if p.spec_enabled else 0), "tp": str(p.parallel.tp),
            "nnodes": str(p.parallel.nnodes)}
    info.update({k.lower(): launch.env.get(k, os.environ.get(k, "")) for k in NCCL_LABELS})
    return info


def check_pair(launch: Launch, dry_run: bool) -> str:
    p = launch.profile
    if not p.spec_enabled:
        return "pair check: speculation off"
    local = os.path.isdir(p.model.path) and os.path.isdir(p.model.draft)
    if not local and (dry_run or p.engine in ("sglang", "vllm")):
        return (f"pair check: skipped ({p.model.path} or {p.model.draft} is not a local directory here; a dry run "
                f"checks a pair from its config.json files alone, e.g. the Kimi-K2.5 shapes: --model "
                f"{KIMI_SHAPES}/kimi-k2.5 --draft {KIMI_SHAPES}/kimi-k2-eagle3 or kimi-k2.5-eagle3-mla)")
    return "pair check: " + check_pair_configs(p.model.path, p.model.draft, p.engine)


def check_parsers(launch: Launch) -> str:
    """The tool-call and reasoning parser names against SGLang's tables (ParserSetupError)."""
    s = launch.profile.server
    if not s.tool_call_parser and not s.reasoning_parser:
        return "parsers: none (tools need tool_choice none, required or a named function; no reasoning_content)"
    try:
        check_parser_names(s.tool_call_parser, s.reasoning_parser)
    except ParserSetupError as e:
        raise ParserSetupError(f"{launch.profile.source}: server.{e}") from None
    return f"parsers: tool calls {s.tool_call_parser or '-'}, reasoning {s.reasoning_parser or '-'} (SGLang's)"


def check_files(launch: Launch) -> str:
    """Before serving: every local checkpoint file is there and complete, so a missing or
    truncated file stops the launch with one error instead of a server whose engine never
    loads. Non-local model paths (an SGLang hub id) are left to the engine."""
    p = launch.profile
    draft = p.model.draft if p.spec_enabled else None
    if p.engine in ("sglang", "vllm") and not (os.path.isdir(p.model.path) and (draft is None or os.path.isdir(draft))):
        return "checkpoint check: skipped (not local directories)"
    try:
        return check_checkpoint_files(p.model.path, draft)
    except CheckpointError as e:  # name what set the path: the flag or the profile
        key = "model.draft" if str(e).startswith("drafter") else "model.path"
        raise CheckpointError(f"{launch.where(key)}: {key}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.no_profile:
            name, why = None, None
        else:
            name, why = (args.profile, None) if args.profile else default_profile(os.environ)
        notes = [why] if why else []
        overrides = Overrides(
            steps=args.steps, topk=args.topk, draft_tokens=args.draft_tokens, no_spec=args.no_spec,
            model=args.model, draft=args.draft, api_key=args.api_key, settings=settings(args))
        if args.steps == "auto":
            overrides.steps = None
            choice, msg = auto_setting(resolve(name, overrides).profile)
            notes.append(msg)
            if choice is not None and choice.steps == 0:
                overrides.no_spec = True
            elif choice is not None and choice.steps_by_batch:
                overrides.steps, overrides.steps_by_batch = choice.steps, choice.steps_by_batch
            elif choice is not None:  # an explicit --topk / --draft-tokens still wins
                overrides.steps = choice.steps
                if args.topk is None and args.draft_tokens is None:
                    overrides.topk, overrides.draft_tokens = choice.topk, choice.draft_tokens
        launch = resolve(name, overrides)
        launch.notes[:0] = notes
    except ProfileError as e:
        print(f"specserve: error: {e}", file=sys.stderr)
        return 2
    os.environ.update(launch.env)  # before any engine process (SGLang's schedulers, NCCL) starts
    print(describe(launch), flush=True)
    try:
        print(check_parsers(launch), flush=True)
        print(check_pair(launch, args.dry_run), flush=True)
        if not args.dry_run:
            print(check_files(launch), flush=True)
        plan = make_plan(launch, vllm_drafter(launch, args.dry_run))
    except (ProfileError, PairMismatch, CheckpointError, FileNotFoundError, ParserSetupError, ValueError) as e:
        print(f"specserve: error: {e}", file=sys.stderr)
        return 2
    print(describe_plan(plan), flush=True)
    if args.dry_run:
        return 0
    return run(launch, plan)


def vllm_drafter(launch: Launch, dry_run: bool) -> str | None:
    """For vLLM: print which layer outputs the drafter gets; when serving, the drafter folder made
    for vLLM (launch/vllm_drafter.py). None: the profile's drafter as it is."""
    p = launch.profile
    if p.engine != "vllm" or not p.spec_enabled:
        return None
    if not (os.path.isdir(p.model.path) and os.path.isdir(p.model.draft)):
        print("vllm drafter: not local here; give vLLM a drafter exported for it (aux ids = inputs of layers)",
              flush=True)
        return None
    from launch.pair_check import read_config, target_shape
    from launch.vllm_drafter import aux_plan, vllm_copy

    layers = target_shape(read_config(p.model.path), p.model.path).num_hidden_layers
    served, fed, recorded = aux_plan(p.model.draft, layers)
    print(f"vllm drafter: eagle_aux_hidden_state_layer_ids {served} (inputs of layers): vLLM feeds the outputs "
          f"of layers {fed} of {layers}" + ("" if recorded else " (no training record: ids read as layer outputs, "
                                            "CHECK)"), flush=True)
    configured = (read_config(p.model.draft).get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if configured and list(configured) != served:
        from models.aux_layers import CONVENTION_RULES, captured_layer_outputs, conventions_reading
        written = conventions_reading(configured, layers, fed) if recorded else []
        print(f"vllm drafter: its config holds {list(configured)}"
              + (f", written for {' / '.join(written)} ({CONVENTION_RULES[written[0]]})" if written else "")
              + f"; as given, vLLM would read them as inputs of layers and feed the outputs of layers "
              f"{captured_layer_outputs('vllm', configured, layers)}: served through a copy with {served}", flush=True)
    if dry_run:
        return None
    draft = vllm_copy(p.model.draft, layers)
    print(f"vllm drafter: {draft}" + (" (a copy made for vLLM)" if draft != p.model.draft else ""), flush=True)
    return draft


def run(launch: Launch, plan: Plan) -> int:
    p = launch.profile
    if plan.kind.startswith("vllm") and importlib.util.find_spec("vllm") is None:
        from server.engines.vllm_engine import VLLM_MISSING
        print(f"specserve: error: {VLLM_MISSING.format('no module named vllm')}", file=sys.stderr)
        return 2
    if plan.kind == "vllm-follower":
        sys.stdout.flush()
        os.execv(sys.executable, VLLM_FOLLOWER + plan.vllm_argv)
    if plan.kind.startswith("sglang") and importlib.util.find_spec("sglang") is None:
        from server.engines.sglang_engine import SGLANG_MISSING
        print(f"specserve: error: {SGLANG_MISSING}", file=sys.stderr)
        return 2
    if plan.kind == "sglang-follower":
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "sglang.launch_server", *plan.sglang_argv])
    if plan.kind == "native":
        from engine.process import build_engine_process
        from server.main import LOG_FORMAT
        engine = build_engine_process(plan.native_args, log_format=LOG_FORMAT, log_level=p.server.log_level)
    elif plan.kind == "vllm":
        from server.engines.vllm_engine import VLLMEngine
        engine = VLLMEngine(plan.vllm_kwargs, served_model_name=p.server.served_model_name)
    else:
        from server.engines.sglang_engine import SGLangEngine
        engine = SGLangEngine(plan.sglang_kwargs, served_model_name=p.server.served_model_name)
    from server.main import serve

    # uvicorn drains on SIGTERM, restores the handler it found and re-raises the signal: make
    # that one a clean exit (0) instead of death by signal (143).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    srv = p.server
    limits = {}  # unset: the server's own defaults
    if srv.request_timeout_s is not None:
        limits["request_timeout_s"] = srv.request_timeout_s or None  # 0: no limit
    if srv.max_body_bytes is not None:
        limits["max_body_bytes"] = srv.max_body_bytes
    try:
        serve(engine, host=srv.host, port=srv.port, api_key=launch.api_key,
              served_model_name=srv.served_model_name, launch_info=launch_info(launch),
              log_level=srv.log_level, shutdown_timeout_s=srv.shutdown_timeout_s or None,
              tool_call_parser=srv.tool_call_parser, reasoning_parser=srv.reasoning_parser, **limits)
    except KeyboardInterrupt:
        return 130
    return 0


def _exit_cleanly(signum, frame):
    raise SystemExit(0)


if __name__ == "__main__":
    raise SystemExit(main())
