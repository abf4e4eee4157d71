"""Launch profiles — the ONE place that loads and resolves them.

Resolution order: profile file (TOML; none: the engine's defaults) -> command-line overrides
-> environment (`${VAR}` / `${VAR:-default}` in string values, SPECSERVE_API_KEY, variables
already exported win over the profile's [env]) -> a `Profile` validated by pydantic -> engine
arguments (launch/engine_args.py). The [speculative] and [native] tables are the engine's own
configuration classes (engine/config.py). Every error names the file (or the flag / variable)
and the dotted field, so a bad profile stops the launch before any engine process starts.
"""
from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass as config_dataclass

from engine.config import CONFIG, NativeConfig, SpecConfig, field_error, one_of
from models.model_source import PREFIX as PYPI
from models.model_source import resolve_model_path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
PROJECT_ROOT = PROFILE_DIR.parent.parent
ENGINES = ("native", "sglang", "vllm")
SGLANG_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
VLLM_DTYPES = SGLANG_DTYPES
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
NO_FILE = "command line"  # the source of a profile built from flags alone (`specserve --no-profile`)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}")
# Set from the profile's own tables, so not accepted in [sglang.extra] / [vllm.extra].
SGLANG_OWNED = {"model_path", "tokenizer_path", "served_model_name", "tp_size", "nnodes", "node_rank",
                "dist_init_addr", "mem_fraction_static", "cuda_graph_max_bs_decode", "dtype", "context_length",
                "max_running_requests", "trust_remote_code"}
VLLM_OWNED = {"model", "tokenizer", "served_model_name", "tensor_parallel_size", "pipeline_parallel_size", "nnodes",
              "node_rank", "master_addr", "master_port", "dtype", "max_model_len", "gpu_memory_utilization",
              "max_num_seqs", "enforce_eager", "trust_remote_code", "speculative_config", "disable_log_stats",
              "per_request_spec_decode_metrics"}


class ProfileError(ValueError):
    """A profile (or an override of it) is invalid; the message names file and field."""


def _fraction(v: float) -> float:
    if not 0.0 < v <= 1.0:
        raise ValueError(f"must be in (0, 1], got {v}")
    return v


def _port(v: int) -> int:
    if not 1 <= v <= 65535:
        raise ValueError(f"must be in 1..65535, got {v}")
    return v


Fraction = Annotated[StrictFloat, AfterValidator(_fraction)]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- the schema: one class per TOML table --------------------------------------------------------
class ModelSection(_Table):
    path: StrictStr = ""
    draft: StrictStr | None = None


class ParallelSection(_Table):
    tp: StrictInt = Field(1, ge=1)
    pp: StrictInt = Field(1, ge=1)              # pipeline stages (vLLM)
    nnodes: StrictInt = Field(1, ge=1)
    node_rank: StrictInt = 0
    dist_init_addr: StrictStr | None = None

    @model_validator(mode="after")
    def _nodes(self):
        if not 0 <= self.node_rank < self.nnodes:
            raise field_error("node_rank", f"must be in [0, nnodes = {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1:
            if not self.dist_init_addr:
                raise field_error("dist_init_addr", "is required when nnodes > 1 (host:port of node 0)")
            if self.tp * self.pp % self.nnodes:
                raise field_error("tp", f"tp = {self.tp} does not split evenly over nnodes = {self.nnodes}")
        return self


@config_dataclass(config=CONFIG)
class SpeculativeSection(SpecConfig):
    """The engine's SpecConfig, and whether to speculate at all and where a step sweep lives."""
    enabled: StrictBool = True
    # Where `benchmarks.batch_sweep` writes its result; `--steps auto` reads it.
    sweep_file: StrictStr | None = None

    @model_validator(mode="after")
    def _drafts_somewhere(self):
        if self.enabled and self.steps_by_batch and not any(k for _, k in self.steps_by_batch):
            raise field_error("steps_by_batch", "drafts at no batch size: set speculative.enabled = false instead")
        return self

    def engine_config(self) -> SpecConfig:
        return SpecConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SpecConfig)})


class ServerSection(_Table):
    host: StrictStr = Field("127.0.0.1", description="address to listen on")
    port: Annotated[StrictInt, AfterValidator(_port)] = Field(8000, description="port to listen on")
    served_model_name: StrictStr | None = Field(None, description="model id for clients (default: the model "
                                                                  "directory's name)")
    log_level: one_of(*LOG_LEVELS) = Field("info", description=" | ".join(LOG_LEVELS))
    shutdown_timeout_s: StrictFloat = Field(30.0, ge=0, description="on SIGTERM, drain in-flight requests at most "
                                                                    "this many seconds (0: no limit)")
    request_timeout_s: StrictFloat | None = Field(None, ge=0, description="per-request limit in seconds (0: none; "
                                                                          "unset: the server's default)")
    max_body_bytes: StrictInt | None = Field(None, ge=1, description="larger request bodies get 413 (unset: the "
                                                                     "server's default)")
    tool_call_parser: StrictStr | None = Field(None, description="SGLang's tool-call format of the model (kimi_k2, "
                                                                 "hermes, qwen25, ...): tools and tool_choice auto "
                                                                 "need one")
    reasoning_parser: StrictStr | None = Field(None, description="SGLang's reasoning format (kimi_k2, deepseek-r1, "
                                                                 "qwen3, ...): thinking goes to reasoning_content")


class SGLangSection(_Table):
    mem_fraction_static: Fraction | None = None
    cuda_graph_max_bs_decode: StrictInt | None = Field(None, ge=1)
    dtype: one_of(*SGLANG_DTYPES) = "auto"
    context_length: StrictInt | None = None
    max_running_requests: StrictInt | None = None
    trust_remote_code: StrictBool = False
    extra: dict = Field(default_factory=dict)  # further sglang ServerArgs fields, passed as given

    @field_validator("extra")
    @classmethod
    def _not_owned(cls, v: dict) -> dict:
        clash = sorted(k for k in v if k in SGLANG_OWNED or k.startswith("speculative_"))
        if clash:
            raise ValueError(f"{', '.join(clash)} are set from the profile's own tables, not [sglang.extra]")
        if v.get("incremental_streaming_output"):
            raise ValueError("incremental_streaming_output is not supported (the engine adapter expects "
                             "cumulative chunks)")
        return v


class VLLMSection(_Table):
    dtype: one_of(*VLLM_DTYPES) = "auto"
    max_model_len: StrictInt | None = Field(None, ge=1)
    gpu_memory_utilization: Fraction | None = None   # on CPU: the fraction of RAM for the KV cache
    max_num_seqs: StrictInt | None = Field(None, ge=1)
    draft_tensor_parallel_size: StrictInt | None = None  # 1 or parallel.tp (vLLM's default: tp)
    enforce_eager: StrictBool = False
    trust_remote_code: StrictBool = False
    extra: dict = Field(default_factory=dict)  # further vLLM AsyncEngineArgs fields, passed as given

    @field_validator("extra")
    @classmethod
    def _not_owned(cls, v: dict) -> dict:
        clash = sorted(k for k in v if k in VLLM_OWNED)
        if clash:
            raise ValueError(f"{', '.join(clash)} are set from the profile's own tables, not [vllm.extra]")
        return v


class Profile(_Table):
    """A validated profile; `name` and `source` say where it came from (not TOML keys)."""
    description: StrictStr = ""
    engine: one_of(*ENGINES) = "native"
    model: ModelSection = Field(default_factory=ModelSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    speculative: SpeculativeSection = Field(default_factory=SpeculativeSection)
    env: dict[str, str] = Field(default_factory=dict)
    server: ServerSection = Field(default_factory=ServerSection)
    native: NativeConfig = Field(default_factory=NativeConfig)
    sglang: SGLangSection = Field(default_factory=SGLangSection)
    vllm: VLLMSection = Field(default_factory=VLLMSection)
    _name: str = PrivateAttr("")
    _source: str = PrivateAttr("")

    @property
    def name(self) -> str:
        return self._name

    @property
    def source(self) -> str:
        return self._source

    @property
    def spec_enabled(self) -> bool:
        return self.speculative.enabled and bool(self.model.draft)

    @field_validator("env", mode="before")
    @classmethod
    def _env_names(cls, table):
        if not isinstance(table, dict):
            return table  # pydantic: must be a table
        for k, v in table.items():
            if not _ENV_NAME.match(k):
                raise field_error(k, "not a valid environment variable name")
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise field_error(k, f"expected a string, got {v!r}")
        return {k: str(v) for k, v in table.items()}

    @model_validator(mode="after")
    def _across_tables(self):
        s, par = self.speculative, self.parallel
        if not self.model.path:
            raise field_error("model.path", "is required (the target model directory)")
        if s.enabled and not self.model.draft:
            raise field_error("model.draft", "speculative.enabled is true but no drafter is set (give --draft or "
                                             "--no-spec)")
        if par.pp > 1 and self.engine != "vllm":
            raise field_error("parallel.pp", f"pipeline parallelism is set up for the vLLM engine only, not "
                                             f"{self.engine}")
        if par.nnodes > 1 and self.engine == "native":
            raise field_error("parallel.nnodes", "the native engine runs on one node")
        if self.vllm.draft_tensor_parallel_size not in (None, 1, par.tp):
            raise field_error("vllm.draft_tensor_parallel_size", f"vLLM takes 1 or parallel.tp = {par.tp}, got "
                                                                 f"{self.vllm.draft_tensor_parallel_size}")
        if s.accept_rates and self.engine != "native":
            raise field_error("speculative.accept_rates", f"steps from measured costs are the native engine's; "
                                                          f"{self.engine} takes steps_by_batch")
        if self.engine == "vllm" and s.enabled and s.topk != 1:
            raise field_error("speculative.topk", "the vLLM engine drafts a chain (topk = 1, num_speculative_tokens "
                                                  "= steps)")
        return self


TABLES = {name: f.annotation for name, f in Profile.model_fields.items()
          if isinstance(f.annotation, type) and (issubclass(f.annotation, BaseModel)
                                                 or dataclasses.is_dataclass(f.annotation))}


def table_fields(cls) -> dict:
    """name -> pydantic FieldInfo of a table's class (a model or a pydantic dataclass)."""
    return cls.model_fields if issubclass(cls, BaseModel) else cls.__pydantic_fields__


def flag_name(key: str) -> str:
    """The command-line flag of a dotted profile key: native.max_batch -> --max-batch,
    server.shutdown_timeout_s -> --shutdown-timeout (the unit is in the help)."""
    return "--" + key.split(".")[-1].removesuffix("_s").replace("_", "-")


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
    api_key: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # "server.port": 9001, ... (launch/flags.py)


@dataclass
class Launch:
    """A resolved profile plus what comes from outside the file: env to export, API key."""
    profile: Profile
    env: dict[str, str]             # exported into os.environ before any engine starts
    env_origin: dict[str, str]      # per variable: "profile" or "environment (profile: X)"
    api_key: str | None = None
    notes: list[str] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)  # dotted key -> the flag that set it

    def where(self, key: str) -> str:
        """What set `key`: its flag, or the profile file."""
        return self.origin.get(key, self.profile.source)


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
def resolve(name_or_path: str | None, overrides: Overrides | None = None,
            environ: Mapping[str, str] | None = None) -> Launch:
    """file -> overrides -> environment -> validated Launch (engine arguments come after).
    `name_or_path` None: no file, the native engine's defaults with speculation on when a
    drafter is given (`python -m server`)."""
    overrides = overrides or Overrides()
    environ = os.environ if environ is None else environ
    if name_or_path is None:
        raw = {"engine": "native", "speculative": {"enabled": overrides.draft is not None}}
        name, source, base = "flags", NO_FILE, Path.cwd()
    else:
        path = find_profile(name_or_path)
        raw = read_toml(path)
        name, source = path.stem, str(path)
        base = PROJECT_ROOT if path.parent == PROFILE_DIR else path.parent
    origin: dict[str, str] = {}
    notes = _apply_overrides(raw, overrides, origin)
    expanded = _expand_env(raw, environ, source, origin)
    profile = build_profile(raw, name, source, base, origin, expanded)
    env, env_origin = _effective_env(profile.env, environ)
    api_key = overrides.api_key or environ.get("SPECSERVE_API_KEY") or None
    if overrides.no_spec and overrides.steps is not None:
        notes.append("--no-spec given: --steps is ignored")
    native = profile.native
    if profile.engine == "native" and native.compile and 0 < native.compile_max_batch < native.max_batch:
        larger = ("compile when they first run, and their requests wait" if native.compile_before_ready
                  else "are served by eager steps")
        notes.append(f"native.compile_max_batch {native.compile_max_batch} < max_batch {native.max_batch}: larger "
                     f"batches {larger} (--compile-max-batch {native.max_batch} compiles them all)")
    return Launch(profile, env, env_origin, api_key, notes, origin)


def _apply_overrides(raw: dict, o: Overrides, origin: dict[str, str]) -> list[str]:
    notes = []

    def put(section: str, key: str, value, flag: str):
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            return  # validation reports the bad table
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
        if o.steps_by_batch is None and (spec.get("steps_by_batch") or spec.get("accept_rates")):
            chooser = "steps_by_batch" if spec.get("steps_by_batch") else "accept_rates (steps from measured costs)"
            notes.append(f"--steps {o.steps}: every batch size drafts {o.steps} (the profile's {chooser} "
                         f"is not used)")
        put("speculative", "steps_by_batch", o.steps_by_batch or {}, "--steps")
        put("speculative", "accept_rates", [], "--steps")
    if o.topk is not None:
        put("speculative", "topk", o.topk, "--topk")
    if o.draft_tokens is not None:
        put("speculative", "draft_tokens", o.draft_tokens, "--draft-tokens")
    elif o.steps is not None or o.topk is not None:
        spec = raw.get("speculative") if isinstance(raw.get("speculative"), dict) else {}
        if spec.get("topk", 1) == 1:  # a chain: keep the draft tokens in step with the steps
            put("speculative", "draft_tokens", 0, "--steps")
            notes.append("draft tokens follow --steps (topk 1: draft_tokens = steps + 1)")
    for key, value in o.settings.items():
        section, name = key.split(".")
        put(section, name, value, flag_name(key))
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


# -- validation ------------------------------------------------------------------------------
_TYPE_NAMES = {"int": "int", "float": "float", "bool": "bool", "string": "str", "dict": "dict"}


def scalar_type(annotation) -> type | None:
    """int for StrictInt, StrictInt | None, ...; None for anything else."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else None
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation if annotation in (bool, int, float) else None


def _from_env(raw: dict, expanded: set[str], origin: dict[str, str], source: str) -> None:
    """An expanded `${VAR}` is a string; where the field is a number or a bool, read it as one."""
    for key in expanded:
        section, _, name = key.partition(".")
        info = table_fields(TABLES[section]).get(name) if section in TABLES else None
        hint = scalar_type(info.annotation) if info is not None else None
        value = raw[section][name] if name else raw[section]
        if hint is None or not isinstance(value, str):
            continue
        try:
            if hint is bool:
                if value.lower() not in ("1", "0", "true", "false"):
                    raise ValueError
                raw[section][name] = value.lower() in ("1", "true")
            else:
                raw[section][name] = hint(value)
        except ValueError:
            raise ProfileError(f"{origin.get(key, source)}: {key}: expected {hint.__name__}, got {value!r}") from None


def _messages(err: ValidationError, source: str, origin: dict[str, str]) -> list[str]:
    """One line per problem: where (the flag that set the field, or the file), the dotted
    field, what is wrong."""
    lines, unknown = [], {}
    for e in err.errors():
        loc = [str(x) for x in e["loc"]]
        ctx = e.get("ctx") or {}
        kind = e["type"]
        if kind in ("extra_forbidden", "unexpected_keyword_argument"):
            unknown.setdefault(".".join(loc[:-1]), []).append(loc[-1])
            continue
        if kind == "field_error":  # a check across fields: it names the field itself
            loc.append(ctx["field"])
            msg = ctx["msg"]
        elif len(loc) == 1 and loc[0] in TABLES and kind in ("model_type", "dataclass_type", "dict_type"):
            lines.append(f"{source}: [{loc[0]}] must be a table, got {e['input']!r}")
            continue
        elif kind.endswith(("_type", "_parsing")) and kind.rsplit("_", 1)[0] in _TYPE_NAMES:
            msg = f"expected {_TYPE_NAMES[kind.rsplit('_', 1)[0]]}, got {e['input']!r}"
        elif kind == "greater_than_equal":
            msg = f"must be >= {ctx['ge']}, got {e['input']!r}"
        elif kind == "greater_than":
            msg = f"must be > {ctx['gt']}, got {e['input']!r}"
        elif kind == "value_error":
            msg = str(ctx["error"])
        else:
            msg = e["msg"]
        key = ".".join(loc)
        lines.append(f"{origin.get(key, source)}: {key}: {msg}")
    for table, keys in unknown.items():
        allowed = ", ".join(table_fields(TABLES[table]) if table else
                            [k for k in Profile.model_fields])
        where = f"[{table}]: " if table else ""
        lines.append(f"{source}: {where}unknown key(s) {', '.join(sorted(keys))}; allowed: {allowed}")
    return lines


def _resolve_path(p: str | None, base: Path) -> str | None:
    if not p:
        return p
    p = os.path.expanduser(resolve_model_path(p))
    return p if os.path.isabs(p) else str((base / p).resolve())


def build_profile(raw: dict, name: str, source: str, base: Path, origin: dict[str, str] | None = None,
                  expanded: set[str] | None = None) -> Profile:
    """Typed, validated Profile from a (possibly overridden and expanded) TOML dict; relative
    paths are resolved against `base`."""
    origin, expanded = origin or {}, expanded or set()
    _from_env(raw, expanded, origin, source)
    try:
        prof = Profile.model_validate(raw)
    except ValidationError as e:
        raise ProfileError("\n".join(_messages(e, source, origin))) from None
    prof._name, prof._source = name, source
    for key in ("path", "draft"):
        try:
            setattr(prof.model, key, _resolve_path(getattr(prof.model, key), base))
        except FileNotFoundError as e:
            raise ProfileError(f"{origin.get('model.' + key, source)}: model.{key}: {e}") from None
    sweep = prof.speculative.sweep_file
    if sweep:
        sweep = os.path.expanduser(sweep)
        prof.speculative.sweep_file = sweep if os.path.isabs(sweep) else str((base / sweep).resolve())
    return prof
