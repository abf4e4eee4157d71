"""Cold and warm start-up, compiled lazily against saved steps (session 27, CPU): a bar chart of the
four `cpu_smollm2_prefill_*_s27.json` runs, each start split into dynamo's tracing, the backend and
the rest (loading, capture, warm-up runs).

    python benchmarks/results/startup/plot_saved_steps.py   # writes saved_steps_startup.png beside it
"""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = [("prefills uncompiled,\ncompiled lazily", "cpu_smollm2_prefill_off_s27"),
        ("prefills uncompiled,\nsaved steps", "cpu_smollm2_prefill_off_saved_steps_s27"),
        ("prefills compiled,\ncompiled lazily", "cpu_smollm2_prefill_on_s27"),
        ("prefills compiled,\nsaved steps", "cpu_smollm2_prefill_on_saved_steps_s27")]
PARTS = [("dynamo's tracing", ("bytecode_tracing",)),
         ("backend (AOT autograd, inductor)", ("OutputGraph.call_user_compiler", "create_aot_dispatcher_function"))]


def parts(start: dict) -> list[float]:
    """Seconds in each of PARTS (the largest of its timers: a lazy compile times its backend as
    call_user_compiler, an ahead-of-time one only inside it), then the rest of ready_s."""
    c = start["compile_s"]
    secs = [max(c.get(k, 0.0) for k in keys) for _, keys in PARTS]
    return secs + [start["ready_s"] - sum(secs)]


def main():
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    for ax, kind in zip(axes, ("cold", "warm")):
        bottoms = [0.0] * len(RUNS)
        split = [parts(json.loads((HERE / f"{name}.json").read_text())["starts"][kind]) for _, name in RUNS]
        for j, label in enumerate([p for p, _ in PARTS] + ["loading, capture, warm-up"]):
            values = [s[j] for s in split]
            ax.bar(range(len(RUNS)), values, bottom=bottoms, label=label)
            bottoms = [b + v for b, v in zip(bottoms, values)]
        for i, total in enumerate(bottoms):
            ax.text(i, total, f"{total:.1f} s", ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(RUNS)), [label for label, _ in RUNS], fontsize=8)
        ax.set_title(f"{kind} start, engine ready (s)")
    axes[0].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M GGUF, plain decoding, max batch 2, CPU 2 cores, float32 (session 27)")
    fig.tight_layout()
    fig.savefig(HERE / "saved_steps_startup.png", dpi=110)


if __name__ == "__main__":
    main()
