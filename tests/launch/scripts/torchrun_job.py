"""A training-script stand-in for torchrun's command lines: what a rank saw, as a torchrun user would check it.

Every rank joins the group (init_process_group from torchrun's variables), all-reduces once and
writes $OUT_DIR/torchrun-rank{RANK}-attempt{TORCHELASTIC_RESTART_COUNT}.json: its argv, torchrun's
variables and the sum; with
  --say TEXT        it prints "TEXT from rank R" on stdout and "TEXT err from rank R" on stderr,
then every rank waits for the others (a barrier), and:
  --fail-first      on the first attempt, rank 0 raises ValueError (after the report)
  --wait-signal     write $OUT_DIR/ready{RANK}, then wait for SIGTERM or SIGUSR2; on one, write
                    $OUT_DIR/got{RANK} with its name and exit 0
Other arguments are recorded, not parsed: they are the docs' own.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
             "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
             "ASCEND_RT_VISIBLE_DEVICES")

out = Path(os.environ["OUT_DIR"])
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
got: list[str] = []
if "--wait-signal" in sys.argv:
    for sig in (signal.SIGTERM, signal.SIGUSR2):
        signal.signal(sig, lambda signum, frame: got.append(signal.Signals(signum).name))
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
npu = getattr(torch, "npu", None)  # where torch_npu is loaded: the devices this rank sees and its own
report = {"argv": sys.argv, "env": {k: os.environ.get(k) for k in VARIABLES}, "sum": value.item(),
          "device_count": npu.device_count() if npu else None, "current_device": npu.current_device() if npu else None}
(out / f"torchrun-rank{rank}-attempt{attempt}.json").write_text(json.dumps(report))
if "--say" in sys.argv:
    text = sys.argv[sys.argv.index("--say") + 1]
    print(f"{text} from rank {rank}", flush=True)
    print(f"{text} err from rank {rank}", file=sys.stderr, flush=True)
dist.barrier()  # every rank has reported and spoken before any fails
dist.destroy_process_group()
if "--fail-first" in sys.argv and rank == "0" and attempt == "0":
    raise ValueError("first attempt fails on rank 0")
if "--wait-signal" in sys.argv:
    (out / f"ready{rank}").write_text("")
    while not got:
        time.sleep(0.05)
    (out / f"got{rank}").write_text(got[0])
