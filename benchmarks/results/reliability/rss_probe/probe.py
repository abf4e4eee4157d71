# Per-round time, RSS and CPU seconds (server, resource tracker, engine) for 100 short requests at concurrency 32,
# repeated N rounds against python -m server on the shipped target (no drafter), one torch thread.
#   python benchmarks/results/reliability/rss_probe/probe.py "" 45 > benchmarks/results/reliability/rss_probe/probe.txt
import asyncio
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, ".")
from benchmarks import reliability_load as rl
from benchmarks.server_proc import free_port, wait_healthy

port = free_port()
proc = rl.start_server("shipped/target", sys.argv[1] or None, port, 8,
                       Path("runs/reliability/rss_probe_server.log"), 1, None)
url = f"http://127.0.0.1:{port}"
try:
    wait_healthy(url, proc)
    import httpx
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    items = rl.request_mix(100, [4], model=model)
    root = psutil.Process(proc.pid)
    last = None
    for rnd in range(int(sys.argv[2])):
        t0 = time.time()
        asyncio.run(rl.run_concurrent(url, items, 32))
        rl.wait_idle(url)
        procs = [root] + root.children(recursive=True)
        cpu = [sum(p.cpu_times()[:2]) for p in procs]
        print(rnd, round(time.time() - t0, 2),
              [(p.pid, p.name()[:12], round(p.memory_info().rss / 2**20, 2)) for p in procs],
              "cpu_s", [round(c - b, 2) for c, b in zip(cpu, last or cpu)], flush=True)
        last = cpu
finally:
    proc.terminate()
    proc.wait(60)
