"""``python -m npu_migrate.compare A B``: the same as ``npu-migrate compare A B``."""

from __future__ import annotations

import sys

from npu_migrate.compare.cli import main

sys.exit(main())
