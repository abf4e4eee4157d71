"""Launch profiles — the ONE place that loads and resolves them.

Resolution order: profile file (TOML) -> command-line overrides -> environment (`${VAR}` /
`${VAR:-default}` in string values, SPECSERVE_API_KEY, variables already exported win over
the profile's [env]) -> a validated `Profile` -> engine arguments (launch/engine_args.py).
Every error names the file (or the flag / variable) and the field, so a bad profile stops the
launch before any engine process starts.
"""
from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from models.model_source import PREFIX as PYPI
from models.model_source import resolve_model_path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
PROJECT_ROOT = PROFILE_DIR.parent.parent
ENGINES = ("native", "sglang", "vllm")
NATIVE_DTYPES = ("auto", "float32", "bfloat16", "float16")
SGLANG_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
VLLM_DTYPES = SGLANG_DTYPES
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}")


class ProfileError(ValueError):
    """A profile (or an override of it) is invalid; the message names file and field."""


# -- the schema: one dataclass per TOML table ------------------------------------------------
@dataclass
class ModelSection:
    path: str = ""
    draft: str | None = None


@dataclass
class ParallelSection:
    tp: int = 1
    pp: int = 1                 # pipeline stages (vLLM)
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None


@dataclass
class SpeculativeSection:
    enabled: bool = True
    steps: int = 3
    topk: int = 1
    draft_tokens: int = 0  # 0: steps + 1 (chain)
    # Steps per batch size, { "largest batch size" = steps, ... } (0: no drafts at that load;
    # launch/steps_table.py): what `benchmarks.step_sweep --concurrency` measured. Empty: `steps`.
    steps_by_batch: dict = field(default_factory=dict)
    sweep_file: str | None = None  # where that sweep writes its result; `--steps auto` reads it


@dataclass
class ServerSection:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    log_level: str = "info"
    shutdown_timeout_s: float = 30.0   # SIGTERM: drain in-flight requests this long (0: no limit)
    tool_call_parser: str | None = None  # SGLang's parser names; the server parses (server/tools.py)
    reasoning_parser: str | None = None


@dataclass
class NativeSection:
    device: str = "auto"        # auto | cpu | cuda | cuda:N
    dtype: str = "auto"
    gguf_q4: bool = False       # a GGUF's 4-bit projections stay 4-bit (CPU)
    max_batch: int = 16
    max_context: int = 0        # 0: the model's max_position_embeddings
    max_waiting: int = 256
    compile: bool = False       # torch.compile the decode steps (fused kernels; a minute or more per batch size)
    compile_max_batch: int = 1  # with compile: batch sizes compiled before serving (larger ones on first use)


@dataclass
class SGLangSection:
    mem_fraction_static: float | None = None
    cuda_graph_max_bs_decode: int | None = None
    dtype: str = "auto"
    context_length: int | None = None
    max_running_requests: int | None = None
    trust_remote_code: bool = False
    extra: dict = field(default_factory=dict)  # further sglang ServerArgs fields, passed as given


@dataclass
class VLLMSection:
    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None   # on CPU: the fraction of RAM for the KV cache
    max_num_seqs: int | None = None
    draft_tensor_parallel_size: int | None = None  # 1 or parallel.tp (vLLM's default: tp)
    enforce_eager: bool = False
    trust_remote_code: bool = False
    extra: dict = field(default_factory=dict)  # further vLLM AsyncEngineArgs fields, passed as given


@dataclass
class Profile:
    name: str
    source: str
    description: str = ""
    engine: str = "native"
    model: ModelSection = field(default_factory=ModelSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    speculative: SpeculativeSection = field(default_factory=SpeculativeSection)
    env: dict = field(default_factory=dict)
    server: ServerSection = field(default_factory=ServerSection)
    native: NativeSection = field(default_factory=NativeSection)
    sglang: SGLangSection = field(default_factory=SGLangSection)
    vllm: VLLMSection = field(default_factory=VLLMSection)

    @property
    def spec_enabled(self) -> bool:
        return self.speculative.enabled and bool(self.model.draft)


_SECTIONS = {"model": ModelSection, "parallel": ParallelSection, "speculative": SpeculativeSection,
             "server": ServerSection, "native": NativeSection, "sglang": SGLangSection,
             "vllm": VLLMSection}
_TOP_SCALARS = {"description": str, "engine": str}


# -- overrides and the resolved launch ---------------------------------------------------------
@dataclass
class Overrides:
    """Command-line values that beat the profile file (None: not given)."""
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    steps_by_batch: dict | None = None   # from --steps auto
    no_spec: bool = False
    model: str | None = None
    draft: str | None = None
    served_model_name: str | None = None
    host: str | None = None
    port: int | None = None
    api_key: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None


@dataclass
class Launch:
    """A resolved profile plus what comes from outside the file: env to export, API key."""
    profile: Profile
    env: dict[str, str]             # exported into os.environ before any engine starts
    env_origin: dict[str, str]      # per variable: "profile" or "environment (profile: X)"
    api_key: str | None = None
    notes: list[str] = field(default_factory=list)


# -- finding and reading -----------------------------------------------------------------------
def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def find_profile(name_or_path: str) -> Path:
    """A built-in profile name (launch/profiles/NAME.toml) or a path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or os.sep in name_or_path:
        if not p.is_file():
            raise ProfileError(f"{p}: profile file not found")
        return p.resolve()
    builtin = PROFILE_DIR / f"{name_or_path}.toml"
    if not builtin.is_file():
        raise ProfileError(f"unknown profile {name_or_path!r}; built-in profiles: "
                           f"{', '.join(available_profiles())} (or give a path to a .toml file)")
    return builtin


def read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not valid TOML ({e})") from e


# -- the pipeline ------------------------------------------------------------------------------
def resolve(name_or_path: str, overrides: Overrides | None = None,
            environ: Mapping[str, str] | None = None) -> Launch:
    """file -> overrides -> environment -> validated Launch (engine arguments come after)."""
    overrides = overrides or Overrides()
    environ = os.environ if environ is None else environ
    path = find_profile(name_or_path)
    raw = read_toml(path)
    origin: dict[str, str] = {}
    notes = _apply_overrides(raw, overrides, origin)
    expanded = _expand_env(raw, environ, str(path), origin)
    base = PROJECT_ROOT if path.parent == PROFILE_DIR else path.parent
    profile = build_profile(raw, path, base, origin, expanded)
    env, env_origin = _effective_env(profile.env, environ)
    api_key = overrides.api_key or environ.get("SPECSERVE_API_KEY") or None
    if overrides.no_spec and overrides.steps is not None:
        notes.append("--no-spec given: --steps is ignored")
    return Launch(profile, env, env_origin, api_key, notes)


def _apply_overrides(raw: dict, o: Overrides, origin: dict[str, str]) -> list[str]:
    notes = []

    def put(section: str, key: str, value, flag: str):
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            return  # build_profile reports the bad table
        raw[section][key] = value
        origin[f"{section}.{key}"] = flag

    cwd = Path.cwd()
    if o.model is not None:
        put("model", "path", o.model if o.model.startswith(PYPI) else str(cwd / o.model), "--model")
    if o.draft is not None:
        put("model", "draft", o.draft if o.draft.startswith(PYPI) else str(cwd / o.draft), "--draft")
    if o.no_spec:
        put("speculative", "enabled", False, "--no-spec")
    if o.steps is not None:  # asking for steps asks for speculation
        put("speculative", "enabled", True, "--steps")
        put("speculative", "steps", o.steps, "--steps")
        spec = raw.get("speculative") if isinstance(raw.get("speculative"), dict) else {}
        if o.steps_by_batch is None and spec.get("steps_by_batch"):
            notes.append(f"--steps {o.steps}: every batch size drafts {o.steps} (the profile's steps_by_batch "
                         f"is not used)")
        put("speculative", "steps_by_batch", o.steps_by_batch or {}, "--steps")
    if o.topk is not None:
        put("speculative", "topk", o.topk, "--topk")
    if o.draft_tokens is not None:
        put("speculative", "draft_tokens", o.draft_tokens, "--draft-tokens")
    elif o.steps is not None or o.topk is not None:
        spec = raw.get("speculative") if isinstance(raw.get("speculative"), dict) else {}
        if spec.get("topk", 1) == 1:  # a chain: keep the draft tokens in step with the steps
            put("speculative", "draft_tokens", 0, "--steps")
            notes.append("draft tokens follow --steps (topk 1: draft_tokens = steps + 1)")
    if o.served_model_name is not None:
        put("server", "served_model_name", o.served_model_name, "--served-model-name")
    if o.host is not None:
        put("server", "host", o.host, "--host")
    if o.port is not None:
        put("server", "port", o.port, "--port")
    if o.tool_call_parser is not None:
        put("server", "tool_call_parser", o.tool_call_parser, "--tool-call-parser")
    if o.reasoning_parser is not None:
        put("server", "reasoning_parser", o.reasoning_parser, "--reasoning-parser")
    return notes


def _expand_env(raw: dict, environ: Mapping[str, str], source: str, origin: dict[str, str]) -> set[str]:
    """Replace ${VAR} / ${VAR:-default} in string values; returns the dotted keys expanded."""
    expanded: set[str] = set()

    def expand(value: str, key: str) -> str:
        def one(m: re.Match) -> str:
            name, default = m.group(1), m.group(3)
            if name in environ and environ[name] != "":
                return environ[name]
            if m.group(2) is not None:
                return default
            raise ProfileError(f"{origin.get(key, source)}: {key}: environment variable {name} is not set "
                               f"(the profile reads it with ${{{name}}})")
        return _ENV_REF.sub(one, value)

    for section, table in raw.items():
        items = table.items() if isinstance(table, dict) else [(None, table)]
        for k, v in items:
            key = section if k is None else f"{section}.{k}"
            if isinstance(v, str) and "${" in v:
                new = expand(v, key)
                if k is None:
                    raw[section] = new
                else:
                    table[k] = new
                expanded.add(key)
    return expanded


def _effective_env(profile_env: dict, environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Variables the operator already exported win over the profile; both are reported."""
    env, origin = {}, {}
    for k, v in profile_env.items():
        if k in environ and environ[k] != v:
            env[k], origin[k] = environ[k], f"environment (profile: {v})"
        else:
            env[k], origin[k] = v, "profile"
    return env, origin


# -- typing and validation ---------------------------------------------------------------------
def _where(key: str, path: Path, origin: dict[str, str]) -> str:
    return origin.get(key, str(path))


def _coerce(value, hint, key: str, where: str, from_env: bool):
    """Check a TOML value against a dataclass field type; env-expanded strings may become numbers."""
    args = typing.get_args(hint)
    if type(None) in args:
        hint = next(a for a in args if a is not type(None))
    bad = ProfileError(f"{where}: {key}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if from_env and isinstance(value, str) and value.lower() in ("1", "0", "true", "false"):
            return value.lower() in ("1", "true")
        raise bad
    if hint in (int, float):
        if from_env and isinstance(value, str):
            try:
                return hint(value)
            except ValueError:
                raise bad from None
        allowed = (int,) if hint is int else (int, float)  # a TOML integer is a valid float
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise bad
        return hint(value)
    if hint is str:
        if not isinstance(value, str):
            raise bad
        return value
    if hint is dict:
        if not isinstance(value, dict):
            raise bad
        return value
    raise TypeError(f"unsupported profile field type {hint!r}")


def _build_section(cls, table, name: str, path: Path, origin: dict[str, str], expanded: set[str]):
    if not isinstance(table, dict):
        raise ProfileError(f"{path}: [{name}] must be a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise ProfileError(f"{path}: [{name}]: unknown key(s) {', '.join(unknown)}; "
                           f"allowed: {', '.join(names)}")
    values = {}
    for k, v in table.items():
        key = f"{name}.{k}"
        values[k] = _coerce(v, hints[k], key, _where(key, path, origin), key in expanded)
    return cls(**values)


def _resolve_path(p: str | None, base: Path) -> str | None:
    if not p:
        return p
    p = os.path.expanduser(resolve_model_path(p))
    return p if os.path.isabs(p) else str((base / p).resolve())


def build_profile(raw: dict, path: Path, base: Path | None = None, origin: dict[str, str] | None = None,
                  expanded: set[str] | None = None) -> Profile:
    """Typed, validated Profile from a (possibly overridden and expanded) TOML dict."""
    origin, expanded = origin or {}, expanded or set()
    base = base or path.parent
    allowed = set(_SECTIONS) | set(_TOP_SCALARS) | {"env"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ProfileError(f"{path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    prof = Profile(name=path.stem, source=str(path))
    for k, typ in _TOP_SCALARS.items():
        if k in raw:
            setattr(prof, k, _coerce(raw[k], typ, k, _where(k, path, origin), k in expanded))
    for name, cls in _SECTIONS.items():
        if name in raw:
            setattr(prof, name, _build_section(cls, raw[name], name, path, origin, expanded))
    prof.env = _build_env(raw.get("env", {}), path)
    for key in ("path", "draft"):
        try:
            setattr(prof.model, key, _resolve_path(getattr(prof.model, key), base))
        except FileNotFoundError as e:
            raise ProfileError(f"{_where('model.' + key, path, origin)}: model.{key}: {e}") from None
    sweep = prof.speculative.sweep_file
    if sweep:
        sweep = os.path.expanduser(sweep)
        prof.speculative.sweep_file = sweep if os.path.isabs(sweep) else str((base / sweep).resolve())
    _validate(prof, path, origin)
    return prof


def _build_env(table, path: Path) -> dict[str, str]:
    if not isinstance(table, dict):
        raise ProfileError(f"{path}: [env] must be a table of NAME = \"value\"")
    env = {}
    for k, v in table.items():
        if not _ENV_NAME.match(k):
            raise ProfileError(f"{path}: env.{k}: not a valid environment variable name")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ProfileError(f"{path}: env.{k}: expected a string, got {v!r}")
        env[k] = str(v)
    return env


def _validate(p: Profile, path: Path, origin: dict[str, str]) -> None:
    def fail(key: str, msg: str):
        raise ProfileError(f"{_where(key, path, origin)}: {key}: {msg}")

    if p.engine not in ENGINES:
        fail("engine", f"{p.engine!r} is not one of {', '.join(ENGINES)}")
    if not p.model.path:
        fail("model.path", "is required (the target model directory)")
    s = p.speculative
    if s.steps < 1:
        fail("speculative.steps", f"must be >= 1, got {s.steps}")
    if s.topk < 1:
        fail("speculative.topk", f"must be >= 1, got {s.topk}")
    if s.topk == 1:
        if s.draft_tokens not in (0, s.steps + 1):
            fail("speculative.draft_tokens", f"topk = 1 needs draft_tokens = steps + 1 = {s.steps + 1}, "
                                             f"got {s.draft_tokens}")
        s.draft_tokens = s.steps + 1
    elif s.draft_tokens < 2:
        fail("speculative.draft_tokens", f"tree drafting (topk = {s.topk}) needs draft_tokens >= 2, "
                                         f"got {s.draft_tokens}")
    if s.steps_by_batch:
        from launch.steps_table import parse_table
        try:
            table = parse_table(s.steps_by_batch)
        except ValueError as e:
            fail("speculative.steps_by_batch", str(e))
        if s.topk != 1:
            fail("speculative.steps_by_batch", f"steps per batch size are for chains (topk = 1), not topk = {s.topk}")
        most = max(k for _, k in table)
        if most > s.steps:
            fail("speculative.steps", f"must be >= the most steps_by_batch drafts ({most}), got {s.steps}")
        if most == 0 and s.enabled:
            fail("speculative.steps_by_batch", "drafts at no batch size: set speculative.enabled = false instead")
    if s.enabled and not p.model.draft:
        fail("model.draft", "speculative.enabled is true but no drafter is set (give --draft or --no-spec)")
    par = p.parallel
    if par.tp < 1:
        fail("parallel.tp", f"must be >= 1, got {par.tp}")
    if par.pp < 1:
        fail("parallel.pp", f"must be >= 1, got {par.pp}")
    if par.pp > 1 and p.engine != "vllm":
        fail("parallel.pp", f"pipeline parallelism is set up for the vLLM engine only, not {p.engine}")
    if par.nnodes < 1:
        fail("parallel.nnodes", f"must be >= 1, got {par.nnodes}")
    if not 0 <= par.node_rank < par.nnodes:
        fail("parallel.node_rank", f"must be in [0, nnodes = {par.nnodes}), got {par.node_rank}")
    if par.nnodes > 1:
        if not par.dist_init_addr:
            fail("parallel.dist_init_addr", "is required when nnodes > 1 (host:port of node 0)")
        if par.tp * par.pp % par.nnodes:
            fail("parallel.tp", f"tp = {par.tp} does not split evenly over nnodes = {par.nnodes}")
        if p.engine == "native":
            fail("parallel.nnodes", "the native engine runs on one node")
    if not 1 <= p.server.port <= 65535:
        fail("server.port", f"must be in 1..65535, got {p.server.port}")
    if p.server.log_level not in LOG_LEVELS:
        fail("server.log_level", f"{p.server.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    n = p.native
    if n.dtype not in NATIVE_DTYPES:
        fail("native.dtype", f"{n.dtype!r} is not one of {', '.join(NATIVE_DTYPES)}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", n.device):
        fail("native.device", f"{n.device!r} is not auto, cpu, cuda or cuda:N")
    for k in ("max_batch", "max_waiting"):
        if getattr(n, k) < 1:
            fail(f"native.{k}", f"must be >= 1, got {getattr(n, k)}")
    if n.max_context < 0:
        fail("native.max_context", f"must be >= 0, got {n.max_context}")
    g = p.sglang
    if g.mem_fraction_static is not None and not 0.0 < g.mem_fraction_static <= 1.0:
        fail("sglang.mem_fraction_static", f"must be in (0, 1], got {g.mem_fraction_static}")
    if g.cuda_graph_max_bs_decode is not None and g.cuda_graph_max_bs_decode < 1:
        fail("sglang.cuda_graph_max_bs_decode", f"must be >= 1, got {g.cuda_graph_max_bs_decode}")
    if g.dtype not in SGLANG_DTYPES:
        fail("sglang.dtype", f"{g.dtype!r} is not one of {', '.join(SGLANG_DTYPES)}")
    owned = {"model_path", "tokenizer_path", "served_model_name", "tp_size", "nnodes", "node_rank",
             "dist_init_addr", "mem_fraction_static", "cuda_graph_max_bs_decode", "dtype", "context_length",
             "max_running_requests", "trust_remote_code"}
    clash = sorted(k for k in g.extra if k in owned or k.startswith("speculative_"))
    if clash:
        fail("sglang.extra", f"{', '.join(clash)} are set from the profile's own tables, not [sglang.extra]")
    if g.extra.get("incremental_streaming_output"):
        fail("sglang.extra", "incremental_streaming_output is not supported (the engine adapter expects "
                             "cumulative chunks)")
    v = p.vllm
    if v.dtype not in VLLM_DTYPES:
        fail("vllm.dtype", f"{v.dtype!r} is not one of {', '.join(VLLM_DTYPES)}")
    if v.gpu_memory_utilization is not None and not 0.0 < v.gpu_memory_utilization <= 1.0:
        fail("vllm.gpu_memory_utilization", f"must be in (0, 1], got {v.gpu_memory_utilization}")
    for k in ("max_model_len", "max_num_seqs"):
        if getattr(v, k) is not None and getattr(v, k) < 1:
            fail(f"vllm.{k}", f"must be >= 1, got {getattr(v, k)}")
    if v.draft_tensor_parallel_size not in (None, 1, par.tp):
        fail("vllm.draft_tensor_parallel_size", f"vLLM takes 1 or parallel.tp = {par.tp}, got "
                                                f"{v.draft_tensor_parallel_size}")
    if p.engine == "vllm" and s.enabled and s.topk != 1:
        fail("speculative.topk", "the vLLM engine drafts a chain (topk = 1, num_speculative_tokens = steps)")
    owned = {"model", "tokenizer", "served_model_name", "tensor_parallel_size", "pipeline_parallel_size", "nnodes",
             "node_rank", "master_addr", "master_port", "dtype", "max_model_len", "gpu_memory_utilization",
             "max_num_seqs", "enforce_eager", "trust_remote_code", "speculative_config", "disable_log_stats",
             "per_request_spec_decode_metrics"}
    clash = sorted(k for k in v.extra if k in owned)
    if clash:
        fail("vllm.extra", f"{', '.join(clash)} are set from the profile's own tables, not [vllm.extra]")
