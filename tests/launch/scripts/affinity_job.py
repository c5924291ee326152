"""Each rank writes the CPUs it may run on, its torch threads and its binding variables to ``OUT_DIR/affinity-rank{RANK}.json``."""

import json
import os
import threading

import torch

seen: dict = {}


def in_a_thread() -> None:  # a thread the script starts: bound like the main thread
    seen["thread"] = sorted(os.sched_getaffinity(0))


thread = threading.Thread(target=in_a_thread)
thread.start()
thread.join()
report = {"cpus": sorted(os.sched_getaffinity(0)), "thread_cpus": seen["thread"], "threads": torch.get_num_threads(),
          "omp": os.environ.get("OMP_NUM_THREADS"), "conf": os.environ.get("CPU_AFFINITY_CONF"),
          "local_rank": int(os.environ["LOCAL_RANK"])}
with open(os.path.join(os.environ["OUT_DIR"], f"affinity-rank{os.environ['RANK']}.json"), "w") as fh:
    json.dump(report, fh)
