"""A rank that reports its session, process group and terminal, then holds (launcher session tests).

Each rank starts a ``sleep`` grandchild, writes $OUT_DIR/session{RANK}.json with what it sees and
waits, without a deadline, until the file named by its first argument exists: the launcher ends it.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

rank = os.environ["RANK"]
grandchild = subprocess.Popen(["sleep", "1000"])
try:
    with open("/dev/tty", "rb"):  # a process with a controlling terminal can open it
        terminal = "opened"
except OSError as exc:
    terminal = os.strerror(exc.errno or 0)
report = {
    "pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
    "parent_sid": os.getsid(os.getppid()), "grandchild": grandchild.pid, "grandchild_pgid": os.getpgid(grandchild.pid),
    "stdin_is_tty": os.isatty(0), "dev_tty": terminal,
}
out = Path(os.environ["OUT_DIR"])
(out / f".session{rank}.tmp").write_text(json.dumps(report))
(out / f".session{rank}.tmp").replace(out / f"session{rank}.json")
while not Path(sys.argv[1]).exists():
    time.sleep(0.2)
