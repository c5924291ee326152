"""A training-script stand-in for hang tests: every rank all-reduces in a loop; one rank misbehaves.

  --steps N          all-reduces per rank (default 4)
  --skip RANK        that rank skips the all-reduce of step 2, so the others wait for it at the end
  --busy             the skipping rank then spins in a Python loop (busy_wait) instead of sleeping
  --release FILE     the skipping rank waits until FILE exists, then makes up the skipped all-reduce
                     (progress resumes and the job ends cleanly); without it, it waits forever
  --crash RANK       that rank raises after its first all-reduce; --kill RANK: SIGKILLs itself; the
                     other ranks then wait outside any collective, so only the launcher ends them (in
                     an all-reduce, gloo would end them itself when the peer's connection closes)
  --in-collective    with --kill, the other ranks go on into the all-reduce instead, and gloo ends
                     them ("Connection closed by peer") when the killed rank's connection closes
Each rank writes $OUT_DIR/at-end{RANK} when it has issued its last collective (or stopped issuing them).
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import npu_migrate as nm


def flag(name: str, default: str | None = None) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def busy_wait(release: str | None) -> None:
    while not (release and os.path.exists(release)):
        pass  # a rank stuck in Python: holds the GIL, never enters a collective


def sleep_wait(release: str | None) -> None:
    while not (release and os.path.exists(release)):
        time.sleep(0.05)


info = nm.init_distributed()
out = Path(os.environ["OUT_DIR"])
steps = int(flag("--steps", "4"))
skip = int(flag("--skip", "-1"))
release = flag("--release")
value = torch.ones(1)
for step in range(steps):
    if step == 1 and info.rank == int(flag("--crash", "-1")):
        raise RuntimeError(f"crash on rank {info.rank}")
    if step == 1 and info.rank == int(flag("--kill", "-1")):
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 1 and (flag("--crash") or flag("--kill")) is not None and "--in-collective" not in sys.argv:
        time.sleep(1000)  # the surviving ranks: out of any collective until the launcher stops them
    if step == 2 and info.rank == skip:
        continue
    dist.all_reduce(value)
(out / f"at-end{info.rank}").touch()
if info.rank == skip:
    (busy_wait if "--busy" in sys.argv else sleep_wait)(release)
    dist.all_reduce(value)  # the one it skipped: the others' last all-reduce completes
nm.destroy_distributed()
