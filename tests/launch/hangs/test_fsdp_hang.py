"""Hang detection sees collectives below ``torch.distributed.*``: FSDP2's, waits on async Works, DDP's buffer broadcast.

Real launchers and ranks (gloo on loopback); each job stops one rank and checks that the report
names it, and where the other waits, with the stacks. Tests wait on the launcher, never on time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import MIGRATE_SCRIPTS
from support import Launch, needs_fsdp2, rank_block

SCRIPTS = Path(__file__).parents[1] / "scripts"
# FSDP2's all-gather, as this torch names it: torch 2.14 added all_gather_single and FSDP2 calls it;
# earlier releases (2.11 on a GPU host) call all_gather_into_tensor.
FSDP2_ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"


@pytest.mark.long
@needs_fsdp2
def test_an_fsdp2_rank_that_stops_before_its_backward_is_named(tmp_path: Path) -> None:
    job = Launch(tmp_path, "--migrate", "--device-num", "2", "--hang-timeout", "5", str(MIGRATE_SCRIPTS / "accelerator_fsdp2.py"),
                 STOP_BEFORE_BACKWARD="1")
    assert job.wait(300) == 1, job.err
    err = job.err
    assert f"hang: rank 1 is not in a collective (last: {FSDP2_ALL_GATHER} #" in err, err
    assert f"; rank 0 is in {FSDP2_ALL_GATHER} #" in err, err
    assert "in _pre_backward" in rank_block(err, 0) and "accelerator_fsdp2.py\", line" in rank_block(err, 0)
    assert "accelerator_fsdp2.py\", line" in rank_block(err, 1)
    assert "migration saw no CUDA" not in err  # a failed job's ranks may not have written their records


@pytest.mark.long
@pytest.mark.parametrize("mode, stopped, waiting, op", [
    ("async", 1, 0, "all_reduce #2"),  # blocked in Work.wait() of an all_reduce(async_op=True)
    ("buffers", 0, 1, "broadcast_coalesced #7"),  # DDP construction: verify_params #1, broadcast_coalesced #2
])
def test_a_rank_waiting_below_torch_distributed_is_in_a_collective(tmp_path: Path, mode: str, stopped: int,
                                                                   waiting: int, op: str) -> None:
    job = Launch(tmp_path, "--device-num", "2", "--hang-timeout", "5", str(SCRIPTS / "below_dist_hang.py"),
                 "--mode", mode)
    assert job.wait(240) == 1, job.err
    err = job.err
    assert f"hang: rank {stopped} is not in a collective (last: " in err, err
    assert f"; rank {waiting} is in {op} since" in err, err
    block = rank_block(err, waiting)
    assert block.startswith(f"--- rank {waiting}: in {op}") and "below_dist_hang.py\", line" in block, block
