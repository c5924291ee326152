"""A duplicate node rank is refused in one line in every timing: beside jobs that end before, while and after it is checked.

Two launchers with the same ``--node-rank 1`` start together with node 0, beside a job of 1, 3 or
10 s (the job's own length is what moves the timing; nothing here sleeps). Whichever of the two
claims the node rank first runs the job; the other is refused. If the refusal comes while the job
is still forming, it ends the job on every node, each saying why. Either way no launcher prints a
traceback, and the refused one ends with the refusal as its last line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import free_port
from support import launcher, one_line_errors

REFUSAL = "node rank 1 is already taken by the launcher on host"
FIX = "give every node a different --node-rank in [0, 2)."
LATE = re.compile(r"^npu-migrate launch: error: (node 0's launcher at 127\.0\.0\.1:\d+ stopped answering while this "
                  r"node was connecting |could not reach node 0's launcher at 127\.0\.0\.1:\d+ within 60 s)")
"""The line of a launcher that came as node 0's job ended, or after (a loaded machine can start the
third launcher seconds after the others, and the job of the other two ends meanwhile): it names
node 0 gone, in one line, within the duplicates' --join-timeout of 60 s."""
REPEATS = int(os.environ.get("DUPLICATE_REPEATS", "2"))  # 5 or more for a longer stress run
RANK_LINE = re.compile(r"^\[\S+ node\d+ rank\d+\] ")
"""A line a rank wrote, relayed with its prefix (``[host node1 rank1] ...``)."""


@pytest.mark.long
@pytest.mark.parametrize("repeat", range(REPEATS))
@pytest.mark.parametrize("seconds", ["1", "3", "10"])
def test_a_duplicate_node_rank_is_refused_in_one_line(tmp_path: Path, seconds: str, repeat: int) -> None:
    port = free_port()
    job = ("--sleep", seconds)
    node0 = launcher(tmp_path, 0, port, job=job)
    first = launcher(tmp_path, 1, port, job=job, name="first", join_timeout="60")
    second = launcher(tmp_path, 1, port, job=job, name="second", join_timeout="60")
    codes = {launch.name: launch.wait() for launch in (node0, first, second)}
    for launch in (node0, first, second):
        # The launchers' own lines; their ranks' relayed output (torch's own warnings when a forming
        # job is ended under them) is the ranks' business.
        one_line_errors("\n".join(line for line in launch.err.splitlines() if not RANK_LINE.match(line)))
    # The refused launcher never joined a round (the other one may have, before a forming job ended).
    refused = [launch for launch in (first, second) if codes[launch.name] == 1
               and REFUSAL in launch.err.strip().splitlines()[-1] and "nodes joined" not in launch.err]
    late = [launch for launch in (first, second) if codes[launch.name] == 1
            and LATE.search(launch.err.strip().splitlines()[-1]) and "nodes joined" not in launch.err]
    if late and not refused:  # it came after the job had ended: nothing is left to refuse it
        ran = [launch for launch in (first, second) if launch is not late[0]][0]
        assert codes[ran.name] == 0 and codes["node0"] == 0, (ran.err, node0.err)
        one_line_errors(late[0].err)
        return
    assert refused, {launch.name: (codes[launch.name], launch.err) for launch in (node0, first, second)}
    one_line_errors(refused[0].err)  # it started no rank: all of its output is its own
    errors = [line for line in refused[0].err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("npu-migrate launch: error: ") and errors[0].endswith(FIX), errors
    ran = [launch for launch in (first, second) if launch is not refused[0]][0]
    if codes[ran.name] == 0:  # refused by the running job: the job itself finished
        assert codes["node0"] == 0, node0.err
    else:  # refused while the job was forming: every node ended, saying why
        for launch in (node0, ran):
            assert codes[launch.name] == 1 and REFUSAL in launch.err, (launch.name, launch.err)
