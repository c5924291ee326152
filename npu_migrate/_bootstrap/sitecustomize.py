"""npu_migrate's start-up hook, on PYTHONPATH only while runtime migration is on.

``npu-migrate run``, ``python -m npu_migrate.launch --migrate`` and ``import npu_migrate.auto`` put
this folder first on PYTHONPATH and set NPU_MIGRATE_MIGRATE=1 (``--probe DIR`` sets NPU_MIGRATE_PROBE), so every Python process the job
starts (mp.spawn and forkserver children, DataLoader workers, ``python`` subprocesses) migrates
too. It runs the sitecustomize it shadows, if any, then arms npu_migrate.migrate.hook, which
installs the migration when the process imports torch, and npu_migrate.compare._hook, which starts
the probe then.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_shadowed_sitecustomize()
if os.environ.get("NPU_MIGRATE_MIGRATE") == "1":
    try:
        from npu_migrate.migrate.hook import arm

        arm()
    except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the interpreter
        sys.stderr.write(f"npu_migrate: runtime migration hook failed: {exc}\n")
if os.environ.get("NPU_MIGRATE_PROBE"):
    try:
        from npu_migrate.compare._hook import arm as _arm_probe

        _arm_probe()
    except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the interpreter
        sys.stderr.write(f"npu_migrate: probe hook failed: {exc}\n")
