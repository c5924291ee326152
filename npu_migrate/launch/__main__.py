"""``python -m npu_migrate.launch``: runs :func:`npu_migrate.launch.cli.main` and leaves at once."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from npu_migrate.launch.cli import main

    _code = main()
    # The job is over and every worker reaped. Tearing down an interpreter that holds torch takes
    # about a second, and a thread may still wait on node 0's store; nothing is left to finalize,
    # so flush and leave.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
