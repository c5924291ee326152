"""A script for the output relay's tests: what each rank writes is chosen by its arguments.

  --lines N       N lines on stdout, each ``<rank>:<i>:`` plus 40 copies of the rank's letter (a, b...),
                  written by print() (two writes each when PYTHONUNBUFFERED=1), at full speed
  --progress      a tqdm-like bar on stderr: ``\\r`` redraws, then a newline
  --partial       a last stdout line without a newline
  --orphan        rank 0 starts ``sleep`` in a new session that keeps its stdout open (pid in
                  $OUT_DIR/orphan.pid): the launcher must not wait for it
  --killed-first  on the first attempt, once rank 1 has written everything, rank 0 SIGKILLs itself
                  (rank 1 waits for the launcher to end it)
Every rank also writes ``stderr from rank <rank>`` on stderr.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
letter = "abcdefgh"[rank % 8]
out = Path(os.environ["OUT_DIR"])
first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"


def flag(name: str) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


for i in range(int(flag("--lines") or 0)):
    print(f"{rank}:{i}:{letter * 40}")
print(f"stderr from rank {rank}", file=sys.stderr)
if "--progress" in sys.argv:
    for pct in (0, 50, 100):
        sys.stderr.write(f"\rrank {rank} progress {pct:3d}%")
        sys.stderr.flush()
    sys.stderr.write("\n")
if "--partial" in sys.argv:
    sys.stdout.write(f"tail of rank {rank}")
if "--orphan" in sys.argv and rank == 0:
    orphan = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    (out / "orphan.pid").write_text(str(orphan.pid))
if "--killed-first" in sys.argv and first_attempt:
    sys.stdout.flush()
    sys.stderr.flush()
    if rank == 1:
        (out / "rank1.done").touch()
        time.sleep(1000)  # only the launcher ends it
    while not (out / "rank1.done").exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
