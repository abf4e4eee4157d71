"""A tuning cache whose kept CPU product forms leave one form out, for an A/B side that runs the
same code without it: ab_run.sh's `*_nod` sides read forms chosen as the engine chooses them
(models/cpu_products.py), timed here, but without oneDNN (what the engine chose before session 34).
The kept file has the key the server computes, so the server reads it instead of measuring.

  python benchmarks/results/batch_sweep/cpu_http/kept_forms_without.py DIR [THREADS] [FORM]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from models.cpu_products import REPS, form_timings, kept_entry, machine_key  # noqa: E402
from models.kept_measurements import kept_measurement  # noqa: E402

folder, threads = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2
drop = sys.argv[3] if len(sys.argv) > 3 else "onednn"


def measure() -> dict:
    timings = {n: {f: t for f, t in ms.items() if f != drop} for n, ms in form_timings(threads, REPS).items()}
    return {**kept_entry(timings), "without": drop}


print(kept_measurement(folder / "cpu_products.json", machine_key(threads), measure, "CPU product forms")["forms"])
