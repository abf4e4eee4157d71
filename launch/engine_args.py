"""The last stage of profile resolution: a validated Profile -> engine arguments.

`sglang_server_args` is the ONE function that knows SGLang's argument names; the in-process
engine gets its result as `sglang.Engine(**kwargs)`, and `--dry-run`, follower nodes and the
CI parser test get the same dict as a command line through `sglang_cli`.
`vllm_engine_args` is the same for vLLM: `AsyncEngineArgs(**kwargs)` in-process, `vllm_cli`
for the dry run and headless follower nodes.
"""
from __future__ import annotations

import dataclasses
import json

from launch.profiles import Profile, ProfileError
from launch.steps_table import sglang_adaptive_file, vllm_schedule


def sglang_server_args(p: Profile) -> dict:
    """sglang ServerArgs keyword arguments (field names of sglang 0.5.23's ServerArgs)."""
    kw: dict = {"model_path": p.model.path, "tp_size": p.parallel.tp}
    if p.server.served_model_name:
        kw["served_model_name"] = p.server.served_model_name
    if p.parallel.nnodes > 1:
        kw.update(nnodes=p.parallel.nnodes, node_rank=p.parallel.node_rank,
                  dist_init_addr=p.parallel.dist_init_addr)
    if p.spec_enabled:
        s = p.speculative
        # SGLang wants steps, topk and draft tokens set together or not at all.
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=p.model.draft,
                  speculative_num_steps=s.steps, speculative_eagle_topk=s.topk,
                  speculative_num_draft_tokens=s.draft_tokens)
        if s.steps_by_batch:  # launch/steps_table.py: one pinned candidate per batch-size slot
            kw.update(speculative_adaptive=True,
                      speculative_adaptive_config=sglang_adaptive_file(s.steps_by_batch))
    g = p.sglang
    optional = {"mem_fraction_static": g.mem_fraction_static,
                "cuda_graph_max_bs_decode": g.cuda_graph_max_bs_decode,
                "context_length": g.context_length, "max_running_requests": g.max_running_requests}
    kw.update({k: v for k, v in optional.items() if v is not None})
    if g.dtype != "auto":
        kw["dtype"] = g.dtype
    if g.trust_remote_code:
        kw["trust_remote_code"] = True
    kw.update(g.extra)
    return kw


def sglang_cli(kwargs: dict) -> list[str]:
    """The same arguments as SGLang's command line (`python -m sglang.launch_server ...`)."""
    argv: list[str] = []
    for k, v in kwargs.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            if v:
                argv.append(flag)
        elif isinstance(v, (list, tuple)):
            argv += [flag, *map(str, v)]
        elif isinstance(v, dict):
            argv += [flag, json.dumps(v)]
        else:
            argv += [flag, str(v)]
    return argv


def vllm_engine_args(p: Profile, draft_dir: str | None = None) -> dict:
    """vLLM AsyncEngineArgs keyword arguments (field names of vllm 0.32's EngineArgs).
    `draft_dir`: the drafter copy made for vLLM (models.eagle3_checkpoint.vllm_drafter_dir: aux
    ids as inputs of layers); the profile's drafter when not given (the dry run)."""
    v, par = p.vllm, p.parallel
    kw: dict = {"model": p.model.path, "tensor_parallel_size": par.tp, "seed": 0, "disable_log_stats": False}
    if par.pp > 1:
        kw["pipeline_parallel_size"] = par.pp
    if p.server.served_model_name:
        kw["served_model_name"] = p.server.served_model_name
    if par.nnodes > 1:  # vLLM's multiprocessing backend across nodes: node 0 here, the others headless
        host, _, port = par.dist_init_addr.rpartition(":")
        kw.update(nnodes=par.nnodes, node_rank=par.node_rank, master_addr=host, master_port=int(port))
    if p.spec_enabled:
        spec = {"method": "eagle3", "model": draft_dir or p.model.draft,
                "num_speculative_tokens": p.speculative.steps}
        if v.draft_tensor_parallel_size is not None:
            spec["draft_tensor_parallel_size"] = v.draft_tensor_parallel_size
        if p.speculative.steps_by_batch:
            spec["num_speculative_tokens_per_batch_size"] = vllm_schedule(p.speculative.steps_by_batch)
        kw.update(speculative_config=spec, per_request_spec_decode_metrics="summary")
    optional = {"max_model_len": v.max_model_len, "gpu_memory_utilization": v.gpu_memory_utilization,
                "max_num_seqs": v.max_num_seqs}
    kw.update({k: val for k, val in optional.items() if val is not None})
    if v.dtype != "auto":
        kw["dtype"] = v.dtype
    for flag in ("enforce_eager", "trust_remote_code"):
        if getattr(v, flag):
            kw[flag] = True
    kw.update(v.extra)
    return kw


def vllm_cli(kwargs: dict) -> list[str]:
    """The same arguments as vLLM's command line (`vllm serve MODEL ...`)."""
    rest = {k: v for k, v in kwargs.items() if k != "model"}
    return [str(kwargs["model"]), *sglang_cli(rest)]


def native_engine_args(p: Profile):
    """engine.loading.NativeEngineArgs for the native engine: the profile's [native] table is its
    NativeConfig, [speculative] its SpecConfig."""
    from engine.config import NativeConfig
    from engine.loading import NativeEngineArgs

    if p.parallel.tp > 1:  # tensor parallelism is the production engines' job
        raise ProfileError(f"{p.source}: parallel.tp: the native engine does not implement tensor parallelism; "
                           f"use tp = 1 or an SGLang or vLLM profile")
    native = {f.name: getattr(p.native, f.name) for f in dataclasses.fields(NativeConfig)}
    return NativeEngineArgs(**native, model=p.model.path, draft=p.model.draft if p.spec_enabled else None,
                            spec=p.speculative.engine_config() if p.spec_enabled else None,
                            served_model_name=p.server.served_model_name,
                            verify_width=p.speculative.engine_config().draft_tokens)
