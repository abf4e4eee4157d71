"""The engine-thread bug, reproduced without the engine: one float32 SmolLM2 decode step on two
threads, timed where the work runs (session 16, 2-core Intel Xeon VM).

  main thread           load, prefill and steps in the main thread
  another thread        the same steps in a second thread, after the main thread's work
                        (what the engine did before da80cbe: load in the caller, decode in its thread)
  all in one thread     load, prefill and steps all in one second thread (what the engine does now)

  PYTHONPATH=. python benchmarks/results/batch_sweep/cpu_http/ab_s16/thread_teams.py  # needs runs/smollm2-hf
"""
import statistics
import threading
import time

from engine.decoder import BatchDecoder
from engine.loading import NativeEngineArgs, load_models
from engine.sampling import BatchSampling


def decoder_at_context():
    target, _, _ = load_models(NativeEngineArgs(model="runs/smollm2-hf", draft=None, spec=None, device="cpu",
                                                dtype="float32", cpu_threads=2))
    dec = BatchDecoder(target, None, None, 8, 1024)
    sampling = BatchSampling.all_greedy_rows(1, dec.device)
    dec.prefill(0, list(range(100, 260)), sampling)
    return dec, sampling, dec.lens[0]


def step_ms(dec, sampling, ctx) -> float:
    def step():
        dec.lens[0] = ctx  # rewind: the same positions and span every step
        dec.step(1, sampling)
    for _ in range(5):
        step()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


if __name__ == "__main__":
    fresh = in_thread(lambda: step_ms(*decoder_at_context()))  # first: no other thread has run torch yet
    state = decoder_at_context()
    print(f"main thread          {step_ms(*state):.1f} ms a step")
    print(f"another thread       {in_thread(lambda: step_ms(*state)):.1f} ms a step")
    print(f"all in one thread    {fresh:.1f} ms a step")
