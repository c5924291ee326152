"""A training-script stand-in for launcher tests; what it does is chosen by its arguments.

Every rank joins the group, all-reduces once and writes $OUT_DIR/rank{RANK}.json with what it saw,
and all-reduces again, so every report is written before any rank misbehaves.
Then, on the rank named by --on-rank (all ranks when -1):
  --fail            raise ValueError
  --exit CODE       os._exit(CODE)
  --signal NAME     kill itself with signal NAME
  --hang            sleep for a long time (all ranks), after starting a `sleep` grandchild
  --fail-first      raise on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0)
  --sleep S         sleep S seconds before finishing (all ranks)
  --wait-for FILE   wait (up to 60 s) until FILE exists before finishing (all ranks)
  --hold FILE       wait (without a deadline: the launcher ends it) until FILE exists (all ranks),
                    after writing $OUT_DIR/holding{RANK}: past every collective, a peer's death
                    reaches this rank only through its launcher
  --ignore-term     ignore SIGTERM (all ranks), so stopping them takes the launcher's grace period
  --in-collective   after writing $OUT_DIR/holding{RANK}: rank 0 sleeps, every other rank waits in an
                    all-reduce rank 0 never joins (rank 0's death reaches them as a connection error)
Unknown arguments are recorded, not parsed, so pass-through can be checked.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import npu_migrate as nm


def flag(name: str) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
info = nm.init_distributed()
# On the rank's device: nccl and hccl reduce only their own devices' tensors.
value = torch.tensor([float(info.rank + 1)], device=info.device)
dist.all_reduce(value)
on_rank = int(flag("--on-rank") or -1)
me = on_rank in (-1, info.rank)
grandchild = subprocess.Popen(["sleep", "1000"]) if "--hang" in sys.argv else None
npu = getattr(torch, "npu", None)
report = {
    "name": __name__,
    "argv": sys.argv,
    "env": {k: os.environ.get(k) for k in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "NPU_MIGRATE_DEVICE")},
    "extra_env": {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "TORCHELASTIC_RUN_ID")},
    "threads": torch.get_num_threads(),
    "backend": info.backend,
    "device": str(info.device),
    "current_device_index": nm.current_device_index(),
    "sum": value.item(),
    "pids": [os.getpid()] + ([grandchild.pid] if grandchild else []),
}
out = Path(os.environ["OUT_DIR"])
# Written whole, then renamed: a reader that sees the file sees all of it.
(out / f".rank{info.rank}.json.tmp").write_text(json.dumps(report))
(out / f".rank{info.rank}.json.tmp").replace(out / f"rank{info.rank}.json")
print(f"rank {info.rank} says hello", flush=True)
# Every rank has written its report before any of them misbehaves below (a test reads them all).
dist.all_reduce(torch.zeros(1, device=info.device))

if me and "--fail" in sys.argv:
    raise ValueError(f"boom on rank {info.rank}")
if me and flag("--exit") is not None:
    os._exit(int(flag("--exit")))
if me and flag("--signal") is not None:
    os.kill(os.getpid(), getattr(signal, flag("--signal")))
if me and "--fail-first" in sys.argv and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    raise RuntimeError("first attempt fails")
if "--hang" in sys.argv or (not me and ("--fail" in sys.argv or flag("--exit") or flag("--signal"))):
    time.sleep(1000)  # the other ranks wait: only the launcher can end them
if "--in-collective" in sys.argv:
    (out / f"holding{info.rank}").touch()
    if info.rank == 0:
        time.sleep(1000)
    dist.all_reduce(torch.zeros(1, device=info.device))
if flag("--hold"):
    (out / f"holding{info.rank}").touch()
    while not os.path.exists(flag("--hold")):
        time.sleep(0.1)
if flag("--sleep"):
    time.sleep(float(flag("--sleep")))
if flag("--wait-for"):
    deadline = time.monotonic() + 60
    while not os.path.exists(flag("--wait-for")) and time.monotonic() < deadline:
        time.sleep(0.05)
nm.destroy_distributed()
