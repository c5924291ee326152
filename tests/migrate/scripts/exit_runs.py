"""Run a 2-rank job RUNS times in a row, each rank a process forked from this warm interpreter.

Usage: python exit_runs.py SCRIPT RUNS OUT_DIR   (CASE and the rest of the environment pass through)

This process imports torch, and what DDP imports when it is constructed, once. Each rank is a
child forked from it: it sets torchrun's variables, runs SCRIPT as ``__main__`` and leaves by
SystemExit from the top of this module, so its interpreter finalizes as a script's does (atexit
hooks, then ``Py_FinalizeEx`` with gloo's threads alive: the moment that used to abort). What a
fresh interpreter adds, importing torch, happens once instead of twice a run. This process
imports nothing of npu_migrate; the script does, in each rank.

Like a launcher, the first rank to fail ends the run (its peer is killed), and a run that has
not ended after RUN_TIMEOUT_S is killed and recorded as hung. Writes OUT_DIR/run{N}/rank{R}.log
and prints one JSON line: per run, per rank, the exit code (negative: the signal that ended it;
"hung": killed at the deadline).
"""

import gc
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback

import torch  # noqa: F401
import torch._dynamo  # noqa: F401 - what DistributedDataParallel imports when it is constructed
import torch.distributed  # noqa: F401
import torch.nn.parallel  # noqa: F401

script, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
NPROC = 2
RUN_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, port: int, run_dir: str) -> None:
    """In a forked rank: never returns; raises SystemExit, which ends the child's interpreter."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(NPROC), LOCAL_WORLD_SIZE=str(NPROC),
                      GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OUT_DIR=run_dir)
    log = os.open(os.path.join(run_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.argv = [script]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - the rank's error: its traceback in its log, exit 1
        traceback.print_exc()
        raise SystemExit(1) from None
    raise SystemExit(0)


def wait_run(pids: list[int]) -> list:
    """Reap the run's ranks; kill the rest when one fails or at the deadline (polls: no signal races)."""
    codes: list = [None] * len(pids)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while None in codes:
        for i, pid in enumerate(pids):
            if codes[i] is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[i] = os.waitstatus_to_exitcode(status)
        failed = any(code not in (None, 0) for code in codes)
        late = time.monotonic() > deadline
        if None in codes and (failed or late):
            for i, pid in enumerate(pids):
                if codes[i] is None:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[i] = "hung" if late else "killed: its peer failed"
        elif None in codes:
            time.sleep(0.05)
    return codes


gc.freeze()  # the warm objects stay shared: a child's finalization need not copy them (gc.freeze's own advice)
results = []
for run in range(runs):
    run_dir = os.path.join(out, f"run{run}")
    os.makedirs(run_dir, exist_ok=True)
    port = free_port()
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    for rank in range(NPROC):
        pid = os.fork()
        if pid == 0:
            rank_main(rank, port, run_dir)
        pids.append(pid)
    results.append(wait_run(pids))
print(json.dumps(results))
