"""npu_migrate's start-up hook, on PYTHONPATH only while runtime migration (or ``--probe``) is on.

``npu-migrate run``, ``python -m npu_migrate.launch --migrate`` and ``import npu_migrate.auto`` put
this folder first on PYTHONPATH and set NPU_MIGRATE_MIGRATE=1 (``--probe DIR`` sets
NPU_MIGRATE_PROBE, ``--profile DIR`` NPU_MIGRATE_PROFILE), so every Python process the job starts (mp.spawn and forkserver children,
DataLoader workers, ``python`` subprocesses) migrates too.

It follows coverage.py's ``process_startup`` pattern: the hook itself is inert unless the job's
variables say otherwise, and it steps aside for everything that is not ours:

* **Foreign interpreters do nothing.** Runtime migration records the exporting interpreter's
  ``sys.prefix`` in NPU_MIGRATE_PYTHON; another interpreter or virtual environment started by the
  job (a system ``python3`` without torch, a tool's own venv) leaves the hook alone, silently, and
  so does any interpreter that cannot import npu_migrate.
* **The sitecustomize it shadows stays the real one.** Only a ``.pth`` file in site-packages runs
  at start-up without a name on the path, and a source checkout or a shared environment has no
  such file to offer; so this module runs the next ``sitecustomize`` on the path as site.py would,
  under the name ``sitecustomize`` (``import sitecustomize`` and its ``__file__`` are the system
  one's), reports its failure as site.py does, and arms the hooks whatever that module did.
* **Nothing is left after the job**: the variables live only in the job's processes.
"""

import os
import sys


def _ours() -> bool:
    """Whether this interpreter is the one that exported the job (or one sharing its environment)."""
    prefix = os.environ.get("NPU_MIGRATE_PYTHON")
    if prefix and os.path.realpath(prefix) != os.path.realpath(sys.prefix):
        return False
    import importlib.util

    return importlib.util.find_spec("npu_migrate") is not None


def _run_next_sitecustomize() -> None:
    """Import the ``sitecustomize`` this module shadows, as ``sitecustomize``, the way site.py does."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    ours = sys.modules["sitecustomize"]
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - site.py's own handling of a failing sitecustomize
        sys.modules["sitecustomize"] = ours  # importlib reads it back once this module has run
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write(
                f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


def _arm() -> None:
    if os.environ.get("NPU_MIGRATE_MIGRATE") == "1":
        try:
            from npu_migrate.migrate.hook import arm

            arm()
        except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the interpreter
            sys.stderr.write(f"npu_migrate: runtime migration hook failed: {exc}\n")
    if os.environ.get("NPU_MIGRATE_PROBE"):
        try:
            from npu_migrate.compare.recording._hook import arm as _arm_probe

            _arm_probe()
        except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the interpreter
            sys.stderr.write(f"npu_migrate: probe hook failed: {exc}\n")
    if os.environ.get("NPU_MIGRATE_PROFILE"):
        try:
            from npu_migrate.profile._hook import arm as _arm_profile

            _arm_profile()
        except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the interpreter
            sys.stderr.write(f"npu_migrate: profile hook failed: {exc}\n")


try:
    if _ours():
        _arm()
finally:
    _run_next_sitecustomize()  # last: it replaces this module in sys.modules
