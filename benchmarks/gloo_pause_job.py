"""The job of bench_gloo_one_cpu.py: all-reduces of several sizes, each after a pause, on a gloo group.

Each rank binds itself to one CPU first when ``BENCH_SELF_BIND`` is set (the baseline: the launcher
binds nothing, so gloo's transport thread keeps nice 0); under ``--cpu-binding`` the launcher has
bound it. After ``BENCH_WARMUP`` untimed calls, each of ``BENCH_CALLS`` calls follows a pause
(``BENCH_PAUSE``: ``sleep`` for 20 ms, as a step waiting on its data; ``compute`` for 20 ms of matrix
products, as a step's forward and backward) and a barrier; rank 0 prints one JSON line: each
size's median call time in ms and the nice value of every thread of the rank.
"""

import json
import os
import statistics
import time

cpus = os.environ.get("BENCH_SELF_BIND")
if cpus:
    os.sched_setaffinity(0, {int(cpus.split(",")[int(os.environ["LOCAL_RANK"])])})

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
pause = os.environ["BENCH_PAUSE"]
calls, warmup = int(os.environ["BENCH_CALLS"]), int(os.environ["BENCH_WARMUP"])
block = torch.randn(128, 128)


def wait() -> None:
    if pause == "sleep":
        time.sleep(0.02)
        return
    end = time.perf_counter() + 0.02
    while time.perf_counter() < end:
        block @ block


result = {}
for size in (1, 4096, 421642):  # a loss, 16 KB of metrics, the MNIST example's 1.7 MB of gradients
    tensor = torch.ones(size)
    times = []
    for i in range(warmup + calls):
        wait()
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    result[str(size)] = statistics.median(times)
result["nice"] = sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")})
if dist.get_rank() == 0:
    print(json.dumps(result), flush=True)
dist.destroy_process_group()
