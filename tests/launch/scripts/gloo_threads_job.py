"""Two gloo groups, a collective on each, then every thread of the rank with its nice value to ``OUT_DIR/gloo-threads-rank{RANK}.json``.

Each thread says which group's creation started it (``group``: 0 the default group, 1 the second,
None before either).
"""

import json
import os
import threading

import torch
import torch.distributed as dist


def tids() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


before = tids()
dist.init_process_group("gloo")
made = [tids() - before]
world = dist.get_world_size()
ones = torch.ones(100_000)
dist.all_reduce(ones)
before = tids()
group = dist.new_group(backend="gloo")  # a second group: its own transport thread
made.append(tids() - before)
twos = torch.full((10,), 2.0)
dist.all_reduce(twos, group=group)
started = threading.Event()
done = threading.Event()
user = threading.Thread(target=lambda: (started.set(), done.wait()))  # a thread of the script's own
user.start()
started.wait()


def read(tid: str, name: str) -> str:
    with open(f"/proc/self/task/{tid}/{name}") as fh:
        return fh.read().strip()


threads = [{"tid": int(tid), "comm": read(tid, "comm"), "nice": os.getpriority(os.PRIO_PROCESS, int(tid)),
            "user": int(tid) == user.native_id,
            "group": next((g for g, new in enumerate(made) if int(tid) in new), None)}
           for tid in sorted(os.listdir("/proc/self/task"))]
done.set()
user.join()
report = {"sums": [ones[0].item(), twos[0].item()], "world": world, "cpus": sorted(os.sched_getaffinity(0)),
          "threads": threads}
with open(os.path.join(os.environ["OUT_DIR"], f"gloo-threads-rank{os.environ['RANK']}.json"), "w") as fh:
    json.dump(report, fh)
dist.destroy_process_group()
