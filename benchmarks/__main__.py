"""`python -m benchmarks` lists the tools; `python -m benchmarks TOOL ARGS...` runs one
(`python -m benchmarks TOOL --help` for its flags)."""
from __future__ import annotations

import importlib
import sys

# tool -> (the module whose main() runs it from sys.argv, the question it answers)
TOOLS = {
    "serve": ("benchmarks.serving", "latency, throughput and accept length of any OpenAI-compatible server; "
              "--check: lossless and leak-free under load"),
    "sweep": ("benchmarks.batch_sweep", "plain decoding, chains and trees at each concurrency in the engine loop; "
              "the steps table a profile serves; random 8B-shaped pairs with synthetic acceptance"),
    "ab": ("benchmarks.ab", "CPU servers side by side over HTTP in alternating rounds (benchmarks/ab/run.sh), "
           "and their start-up times"),
    "startup": ("benchmarks.startup", "cold and warm start-up with compile, and stalls after ready"),
    "costs": ("benchmarks.costs", "what each part of a speculative cycle costs; the speed-up those costs predict"),
    "nccl": ("benchmarks.nccl_sweep", "all-reduce latency per NCCL setting; decode with the target tensor-parallel"),
}


def main(argv: list[str]) -> object:
    if not argv or argv[0] not in TOOLS:
        width = max(map(len, TOOLS))
        print("python -m benchmarks TOOL ARGS...\n\n" + "\n".join(f"  {name:<{width}}  {question}"
                                                               for name, (_, question) in TOOLS.items()))
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(TOOLS[argv[0]][0])
    sys.argv = [f"benchmarks {argv[0]}", *argv[1:]]   # what the tool parses; its usage line names it
    return module.main()


if __name__ == "__main__":
    result = main(sys.argv[1:])
    raise SystemExit(result if isinstance(result, int) else isinstance(result, dict) and result.get("passed") is False)
