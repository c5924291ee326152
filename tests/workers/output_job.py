"""A script for the output relay's tests: what each rank writes is chosen by its arguments.

  --lines N       N lines on stdout, each ``<rank>:<i>:`` plus 40 copies of the rank's letter (a, b...),
                  written by print() (two writes each when PYTHONUNBUFFERED=1), at full speed
  --progress      a tqdm-like bar on stderr: ``\\r`` redraws, then a newline
  --partial       a last stdout line without a newline
Every rank also writes ``stderr from rank <rank>`` on stderr.
"""

import os
import sys

rank = int(os.environ["RANK"])
letter = "abcdefgh"[rank % 8]


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
