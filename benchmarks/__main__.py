"""`python -m benchmarks` lists the tools; `python -m benchmarks TOOL ARGS...` runs one (TOOL --help: its flags)."""
import importlib
import sys

TOOLS = {   # tool -> (the module whose main() runs it from sys.argv, the question it answers)
    "serve": ("benchmarks.serving", "latency, throughput and accept length of any OpenAI-compatible server; "
              "--check: lossless and leak-free under load"),
    "sweep": ("benchmarks.batch_sweep", "plain decoding and chains at each concurrency in the engine loop; the steps "
              "table a profile serves; random 8B-shaped pairs with synthetic acceptance; best against best"),
    "ab": ("benchmarks.ab", "servers side by side over HTTP in alternating rounds (benchmarks/ab/run.sh), and the "
           "tables of their results"),
    "startup": ("benchmarks.startup", "cold and warm start-up of the engine or the server: ready, first answer, "
                "stalls while compiled steps swap in"),
    "nccl": ("benchmarks.nccl_sweep", "NCCL settings and draft steps for a large shape served through vLLM at "
             "tensor parallel N, written into a profile"),
}

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] not in TOOLS:
        width = max(map(len, TOOLS))
        print("python -m benchmarks TOOL ARGS...\n\n" + "\n".join(f"  {name:<{width}}  {question}"
                                                               for name, (_, question) in TOOLS.items()))
        raise SystemExit(0 if not argv or argv[0] in ("-h", "--help") else 2)
    sys.argv = [f"benchmarks {argv[0]}", *argv[1:]]   # what the tool parses; its usage line names it
    result = importlib.import_module(TOOLS[argv[0]][0]).main()
    raise SystemExit(result if isinstance(result, int) else isinstance(result, dict) and result.get("passed") is False)
